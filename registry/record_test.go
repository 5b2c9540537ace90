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
