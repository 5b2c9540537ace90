package registry

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// pathsDisagree decodes record on the map path and, when it qualifies, on
// the fast path: fast reports whether the fast path took it, and why how
// the two disagree ("" when they agree, or only the map path decodes it).
func pathsDisagree(record string) (fast bool, why string) {
	var n1, n2 [7]int64
	var s1, s2 [6]string
	var g1, g2 string
	e1 := decodeRecordMap(record, &n1, &s1, &g1)
	if !plainRecord(record) {
		return false, ""
	}
	handled, e2 := decodeRecordFast(record, &n2, &s2, &g2)
	switch {
	case !handled:
		return false, ""
	case (e1 == nil) != (e2 == nil) || (e1 != nil && e1.Error() != e2.Error()):
		return true, fmt.Sprintf("map path says %v, fast path %v", e1, e2)
	case e1 == nil && (n1 != n2 || s1 != s2 || g1 != g2):
		return true, fmt.Sprintf("map path %v %q %q, fast path %v %q %q", n1, s1, g1, n2, s2, g2)
	}
	return true, ""
}

// TestDecodePathsAgreeExhaustive: every string of up to five bytes over an
// alphabet of the characters the fast path's "\/" rule and number rules
// hinge on (of up to four with upper-case letters and UTF-8 bytes too),
// put where a value, a key and the tail go in a plain record, decodes on
// the fast path (when it takes it) exactly as on the map path.
func TestDecodePathsAgreeExhaustive(t *testing.T) {
	const good = `{"id":"w","browser":"chromium","addr":"h:1","path":"/p","status":"available","gen":"g","capacity":2,"vnodes":8,"heartbeat":1700000000000,"registered":1700000000000,"expires":1700000030000,"suspect_until":0,"predicted_end":0,"sig":"ab"}`
	// the escape and number rules to five bytes; with upper-case letters
	// and UTF-8 (valid, truncated, invalid) to four
	passes := []struct {
		alphabet []byte
		depth    int
	}{
		{[]byte{'\\', '/', '"', 'p', 'e', '0', '1', '.', '-', ',', ':', '}'}, 5},
		{[]byte{'\\', '/', '"', 'p', 'e', 'E', 'P', '0', '1', '.', '-', ':', '}', 0xc3, 0xa9, 0xff, 0xed}, 4},
	}
	holes := []struct{ name, old string }{
		{"path value", `"/p"`},
		{"addr value", `"h:1"`},
		{"sig key", `"sig"`},
		{"capacity value", `2,"vnodes"`},
		{"tail", `}`},
	}
	fast, checked := 0, 0
	buf := make([]byte, 0, 5)
	for _, pass := range passes {
		for _, h := range holes {
			i := strings.Index(good, h.old)
			pre, post := good[:i], good[i+len(h.old):]
			if h.name == "capacity value" {
				post = `,"vnodes"` + good[i+len(h.old):]
			}
			var rec func(depth int)
			rec = func(depth int) {
				record := pre + string(buf) + post
				checked++
				if took, why := pathsDisagree(record); took {
					fast++
					if why != "" {
						t.Errorf("%s %q: %s", h.name, record, why)
					}
				}
				if depth == pass.depth {
					return
				}
				for _, c := range pass.alphabet {
					buf = append(buf, c)
					rec(depth + 1)
					buf = buf[:len(buf)-1]
				}
			}
			rec(0)
		}
	}
	t.Logf("%d records, %d took the fast path", checked, fast)
}

// TestEveryStoredRecordTakesTheFastPath: what register.lua, heartbeat.lua
// and update.lua store (Redis's cjson writes every "/" as "\/", and every
// record has a path, so before the fast path read "\/" no stored record
// took it) for registrations an agent may well send (upper-case
// letters in a path, a host name, an ID or a percent-escape; IPv6
// addresses; non-ASCII paths and IDs, which registration accepts) takes
// decodeWorker's fast path, decodes as the map path does, and its
// signature verifies.
func TestEveryStoredRecordTakesTheFastPath(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	ctx := context.Background()
	secret := []byte("s3cret")
	regs := []Registration{
		{ID: "lower", BrowserType: "chromium", Addr: "127.0.0.1:9001", Path: "/playwright/chromium"},
		{ID: "ipv6", BrowserType: "firefox", Addr: "[fe80::1%eth0]:3000", Path: "/"},
		{ID: "ipv6-upper", BrowserType: "webkit", Addr: "[FE80::1]:3000", Path: "/ws"},
		{ID: "path-upper", BrowserType: "chromium", Addr: "10.0.0.7:3000", Path: "/Playwright/Chromium"},
		{ID: "pct-escape", BrowserType: "chromium", Addr: "10.0.0.7:3000", Path: "/a%2Fb?token=abc"},
		{ID: "Worker-A", BrowserType: "chromium", Addr: "Worker-A.local:3000", Path: "/"},
		{ID: "browser-upper", BrowserType: "Chromium", Addr: "h:1", Path: "/"},
		{ID: "unicode-path", BrowserType: "chromium", Addr: "h:1", Path: "/café/ü"},
		{ID: "wörker", BrowserType: "chromium", Addr: "h:1", Path: "/"},
		{ID: "no-path", BrowserType: "chromium", Addr: "h:1"},
	}
	for _, reg := range regs {
		reg.Pool, reg.Capacity, reg.TTL, reg.Secret = "p", 2, time.Minute, secret
		if err := r.Register(ctx, reg); err != nil {
			t.Fatal(err)
		}
		check := func(step string) {
			t.Helper()
			rec, err := rdb.HGet(ctx, r.Key("p", keyWorkers), reg.ID).Result()
			if err != nil {
				t.Fatal(err)
			}
			took, why := pathsDisagree(rec)
			if !took {
				t.Errorf("%s after %s: stored record %s misses the fast path", reg.ID, step, rec)
				return
			}
			if why != "" {
				t.Errorf("%s after %s: %s", reg.ID, step, why)
			}
			w, err := r.Worker(ctx, "p", reg.ID)
			if err != nil {
				t.Fatal(err)
			}
			if w.Addr != reg.Addr || w.Path != reg.Path {
				t.Errorf("%s after %s: read addr %q path %q, registered %q %q", reg.ID, step, w.Addr, w.Path, reg.Addr, reg.Path)
			}
			if err := w.CheckSignature(secret); err != nil {
				t.Errorf("%s after %s: %v", reg.ID, step, err)
			}
		}
		check("register.lua")
		if _, err := r.Heartbeat(ctx, reg.Pool, reg.ID, time.Minute); err != nil {
			t.Fatal(err)
		}
		check("heartbeat.lua")
		if err := r.SetDraining(ctx, reg.Pool, reg.ID); err != nil {
			t.Fatal(err)
		}
		check("update.lua")
	}
}

// TestRegisteredFieldsReadBack: whatever path, address and browser
// registration accepts, a proxy reads back exactly (on either decode path)
// and the registration's signature verifies; what it could not read back
// (invalid UTF-8, which encoding/json reads as U+FFFD while cjson stores
// the bytes: the signature, made over the bytes, then never verifies)
// registration refuses, naming the field.
func TestRegisteredFieldsReadBack(t *testing.T) {
	r, _ := startRegistry(t, Options{})
	ctx := context.Background()
	secret := []byte("s3cret")
	for i, path := range []string{
		"/", "/a/b", `/q"uote`, `/back\slash`, "/tab\there", "/nl\n", "/del\x7f", "/\u2028", "/é", "/\U0001F600",
		"/\xff", "/\xc3", "/\xed\xa0\x80",
	} {
		reg := Registration{Pool: "p", ID: fmt.Sprintf("w%d", i), BrowserType: "chromium", Addr: "h:1", Path: path,
			Capacity: 1, TTL: time.Minute, Secret: secret}
		err := r.Register(ctx, reg)
		if !utf8.ValidString(path) {
			if err == nil || !strings.Contains(err.Error(), "Path") {
				t.Errorf("path %q: registration says %v, want a refusal naming Path", path, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("path %q: %v", path, err)
		}
		w, err := r.Worker(ctx, "p", reg.ID)
		if err != nil {
			t.Fatal(err)
		}
		if w.Path != path {
			t.Errorf("path %q reads back as %q", path, w.Path)
		}
		if err := w.CheckSignature(secret); err != nil {
			t.Errorf("path %q: %v", path, err)
		}
	}
	for _, reg := range []Registration{
		{Pool: "p", ID: "bad-addr", BrowserType: "chromium", Addr: "h\xff:1", Path: "/"},
		{Pool: "p", ID: "bad-browser", BrowserType: "chrom\xffium", Addr: "h:1", Path: "/"},
		{Pool: "p", ID: "bad-gen", BrowserType: "chromium", Addr: "h:1", Path: "/", Generation: "g\xff"},
		// the id too: a record under it was claimed by Lua and refused by Go
		{Pool: "p", ID: "w\xff1", BrowserType: "chromium", Addr: "h:1", Path: "/"},
	} {
		if err := r.Register(ctx, reg); err == nil {
			t.Errorf("%s: registration of invalid UTF-8 accepted", reg.ID)
		}
	}
}

// FuzzRegisterReadBack: any path, address, browser and generation either
// is refused by registration (invalid UTF-8) or, as register.lua,
// heartbeat.lua and update.lua store it (Redis's cjson), decodes the same
// on both paths, reads back exactly and its signature verifies:
// go test ./registry -run '^$' -fuzz FuzzRegisterReadBack
func FuzzRegisterReadBack(f *testing.F) {
	f.Add("/playwright", "h:1", "chromium", "Worker-A")
	f.Add(`/a\/b"c\`, "[FE80::1]:3000", "Ch\u00e9", "w")
	f.Add("/\u2028\x7f\x01", "h:1", "", "g\xff")
	r, rdb := startRegistry(f, Options{})
	ctx := context.Background()
	secret := []byte("k")
	n := 0
	f.Fuzz(func(t *testing.T, path, addr, browser, gen string) {
		if addr == "" {
			addr = "h:1"
		}
		if checkToken(gen) != nil && utf8.ValidString(gen) {
			gen = "g"
		}
		n++
		id := fmt.Sprintf("w%d", n)
		reg := Registration{Pool: "p", ID: id, BrowserType: browser, Addr: addr, Path: path, Generation: gen,
			Capacity: 1, TTL: time.Minute, Secret: secret}
		err := r.Register(ctx, reg)
		if !utf8.ValidString(path) || !utf8.ValidString(addr) || !utf8.ValidString(browser) || !utf8.ValidString(gen) {
			if err == nil {
				t.Fatalf("invalid UTF-8 registered: %q %q %q %q", path, addr, browser, gen)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		defer r.Deregister(ctx, "p", id)
		for step := 0; step < 3; step++ {
			rec, err := rdb.HGet(ctx, r.Key("p", keyWorkers), id).Result()
			if err != nil {
				t.Fatal(err)
			}
			if _, why := pathsDisagree(rec); why != "" {
				t.Fatalf("record %q: %s", rec, why)
			}
			w, err := r.Worker(ctx, "p", id)
			if err != nil {
				t.Fatal(err)
			}
			if w.Path != path || w.Addr != addr || w.BrowserType != browser || w.gen != gen {
				t.Fatalf("read back %q %q %q %q from %q", w.Path, w.Addr, w.BrowserType, w.gen, rec)
			}
			if err := w.CheckSignature(secret); err != nil {
				t.Fatalf("record %q: %v", rec, err)
			}
			switch step {
			case 0:
				_, err = r.Heartbeat(ctx, "p", id, time.Minute)
			case 1:
				err = r.SetDraining(ctx, "p", id)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	})
}
