package registry

import (
	"strings"
	"testing"
)

// FuzzDecodeWorker: any stored values decode to a worker or an error
// naming what is wrong, never a panic; what decodes has sane figures.
func FuzzDecodeWorker(f *testing.F) {
	good := `{"id":"w","browser":"chromium","addr":"h:1","path":"/p","status":"available","gen":"g","capacity":2,"vnodes":8,"heartbeat":1700000000000,"registered":1700000000000,"expires":1700000030000,"suspect_until":0,"predicted_end":0}`
	f.Add(good, "0", "3", "100,200", "shutdown|1700000060000")
	f.Add(strings.Replace(good, `"capacity":2`, `"capacity":"abc"`, 1), "0", "0", "", "")
	f.Add(strings.Replace(good, `"available"`, `"sleeping"`, 1), "1", "x", "1,,2", "shutdown|")
	f.Add(`{"id":`, "", "", "a", "|")
	f.Add(`null`, "-1", "1e3", "0x10", "shutdown|abc")
	f.Fuzz(func(t *testing.T, record, active, lifetime, durations, command string) {
		w, err := decodeWorker("p", rawWorker{id: "w", record: record, active: active, lifetime: lifetime, durations: durations, command: command}, 1700000000000)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("error without a message")
			}
			return
		}
		if w.Active < 0 || w.Lifetime < 0 || w.Capacity < 0 || (w.Status != "available" && w.Status != "draining") {
			t.Fatalf("decoded nonsense: %+v", w)
		}
		for _, d := range w.Durations {
			if d < 0 {
				t.Fatalf("negative duration: %+v", w)
			}
		}
		if w.Command != "" && w.Command != "shutdown" && !strings.Contains(command, string(w.Command)) {
			t.Fatalf("command %q not from %q", w.Command, command)
		}
	})
}

// FuzzRedactURL: the password of a URL never survives redaction.
func FuzzRedactURL(f *testing.F) {
	f.Add("redis", "user", "s3cretpw", "h1:1,h2:2", "/0?x=1")
	f.Add("rediss+cluster", "", "pässwörd", "h:1", "")
	f.Add("redis+sentinel", "", "s3cretpw", "h1:1,h2:2", "/0") // a password, no master name
	f.Fuzz(func(t *testing.T, scheme, user, pass, hosts, tail string) {
		if len(pass) < 6 || strings.ContainsAny(pass, "@/?#") || strings.Contains(scheme+user+hosts+tail, pass) ||
			strings.ContainsAny(scheme+user, ":@/?") || strings.ContainsAny(hosts, "@/?") || strings.Contains("xxxxx", pass) {
			return
		}
		u := scheme + "://" + user + ":" + pass + "@" + hosts + tail
		if got := RedactURL(u); strings.Contains(got, pass) {
			t.Fatalf("RedactURL(%q) = %q keeps the password", u, got)
		}
	})
}

// FuzzDecodeWorkerPaths: a record that takes decodeWorker's fast path
// decodes exactly as the map path (the rules' definition) decodes it: the
// same figures, or the same error.
func FuzzDecodeWorkerPaths(f *testing.F) {
	good := `{"id":"w","browser":"chromium","addr":"h:1","path":"/p","status":"available","gen":"g","capacity":2,"vnodes":8,"heartbeat":1700000000000,"registered":1700000000000,"expires":1700000030000,"suspect_until":0,"predicted_end":0,"sig":"ab"}`
	f.Add(good)
	for _, r := range [][2]string{
		{`"capacity":2`, `"capacity":"2"`}, {`"capacity":2`, `"capacity":null`}, {`"capacity":2`, `"capacity":[2]`},
		{`"capacity":2`, `"capacity":{}`}, {`"capacity":2`, `"capacity":true`}, {`"capacity":2`, `"capacity":-1`},
		{`"capacity":2`, `"capacity":2.5`}, {`"capacity":2`, `"capacity":1e400`}, {`"capacity":2`, `"capacity":9007199254740992`},
		{`"capacity":2`, `"capacity":1e2`}, {`"capacity":2`, `"capacity":-0`}, {`"capacity":2,`, ``},
		{`"id":"w"`, `"id":5`}, {`"id":"w"`, `"id":null`}, {`"sig":"ab"`, `"sig":7`}, {`"gen":"g"`, `"gen":"g","gen":3`},
		{`"path":"/p"`, `"path":"/p","path":"/q"`}, {`{`, ` {`}, {`}`, `}x`},
		// cjson writes "/" as "\/"; other escapes take the map path
		{`"/p"`, `"\/p\/q"`}, {`"/p"`, `"\/"`}, {`"/p"`, `"\\/p"`}, {`"/p"`, `"\/\"`},
		{`"/p"`, `"p\n"`}, {`"sig":"ab"`, `"s\/g":"ab"`}, {`"/p"`, `"/p\`},
		// upper-case letters and UTF-8 in strings take the fast path; outside
		// them, and invalid UTF-8 anywhere, the map path
		{`"/p"`, `"\/P%2F"`}, {`"h:1"`, `"[FE80::1]:3000"`}, {`"/p"`, `"\/caf\u00e9"`}, {`"/p"`, "\"/caf\xc3\xa9\""},
		{`"/p"`, "\"/caf\xc3\""}, {`"/p"`, "\"/\xed\xa0\x80\""}, {`"sig":"ab"`, `"Sig":"ab"`}, {`"sig":"ab"`, "\"s\xc3\xa9g\":\"ab\""},
		{`"capacity":2`, `"capacity":2E2`}, {`"capacity":2`, `"capacity":True`}, {`}`, "}\xc3\xa9"},
	} {
		f.Add(strings.Replace(good, r[0], r[1], 1))
	}
	var n [7]int64
	var st [6]string
	var g string
	if handled, err := decodeRecordFast(good, &n, &st, &g); !plainRecord(good) || !handled || err != nil {
		f.Fatalf("the usual record misses the fast path: %v", err)
	}
	f.Add(`null`)
	f.Add(`[]`)
	f.Add(`{}`)
	f.Add(` `)
	f.Fuzz(func(t *testing.T, record string) {
		if _, why := pathsDisagree(record); why != "" {
			t.Fatalf("record %q: %s", record, why)
		}
	})
}

// BenchmarkDecodeWorker: what a claim's reply costs Go to decode (the usual
// record, 20 durations): go test ./registry -run '^$' -bench DecodeWorker
func BenchmarkDecodeWorker(b *testing.B) {
	rec := `{"id":"worker-0042","browser":"chromium","addr":"127.0.0.1:40123","path":"\/playwright","status":"available","gen":"a1b2c3d4e5f6a7b8","capacity":4,"vnodes":8,"heartbeat":1700000000000,"registered":1700000000000,"expires":1700000030000,"suspect_until":0,"predicted_end":1700000001234,"sig":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}`
	raw := rawWorker{id: "worker-0042", record: rec, active: "1", lifetime: "42",
		durations: "100,200,300,400,500,600,700,800,900,1000,1100,1200,1300,1400,1500,1600,1700,1800,1900,2000"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeWorker("p", raw, 1700000000000); err != nil {
			b.Fatal(err)
		}
	}
}
