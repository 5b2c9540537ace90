package registry

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// FuzzParseTicket: the agent reads whatever reaches its listener. Any
// Grid-Claim value parses or is refused without a panic; a ticket that
// parses has IDs and a group the registry accepts and reads back the same
// from its own String; with a worker secret, a value that parses is one
// signed with that secret, never with another.
func FuzzParseTicket(f *testing.F) {
	good := Ticket{Session: "s1", Group: "chromium@1.65", Worker: "w-1", Limits: Limits{MaxConcurrent: 2, MaxLifetime: 10},
		MaxSession: time.Minute, Issued: time.UnixMilli(1_800_000_000_000)}
	f.Add(good.Signed(nil).String(), "")
	f.Add(good.Signed([]byte("k")).String(), "k")
	withArgs := good
	withArgs.Args = []string{"--user-agent=a 'b' $(c); d", "--window-size=8,6"}
	f.Add(withArgs.Signed([]byte("k")).String(), "k")
	f.Add("v=1;session=a;group=p;worker=w;at=1;args=WyItLW5vLXNhbmRib3giXQ", "")
	f.Add("v=1;session=a;group=p;worker=w;at=1", "")
	f.Add("v=1;session=a;session=b", "")
	f.Add(";;==;", "x")
	f.Fuzz(func(t *testing.T, v, secret string) {
		tk, err := ParseTicket(v, []byte(secret))
		if err != nil {
			return
		}
		if CheckID(tk.Session) != nil || CheckID(tk.Worker) != nil || CheckPool(tk.Group) != nil {
			t.Fatalf("%q parsed into unusable names: %+v", v, tk)
		}
		again, err := ParseTicket(tk.String(), []byte(secret))
		if err != nil {
			t.Fatalf("%q parsed, but its String %q does not: %v", v, tk.String(), err)
		}
		if again.String() != tk.String() {
			t.Fatalf("%q reads back as %q", tk.String(), again.String())
		}
		if secret != "" {
			if _, err := ParseTicket(v, []byte(secret+"x")); err == nil {
				t.Fatalf("%q verifies with secret %q and with %q", v, secret, secret+"x")
			}
		}
	})
}

// FuzzDecodeRecord: Caddy dials what a worker record says, and any Redis
// writer can write one. A record decodes or is refused without a panic;
// one that decodes names the worker it is stored as, a pool and a dialable
// host:port, and encodes back to a record that decodes the same.
func FuzzDecodeRecord(f *testing.F) {
	rec := NewRecord(Record{ID: "w-1", Pool: "chromium", Version: "1.65", Browser: "chromium", Addr: "10.0.0.5:3131",
		Path: "/playwright", Capacity: 2}, 8, nil)
	raw, _ := json.Marshal(rec)
	f.Add("w-1", string(raw))
	f.Add("w-1", `{"id":"w-1","pool":"chromium","addr":"[::1]:1","path":"/","protocol":1,"weight":1}`)
	f.Add("x", `{"id":"x","pool":"p@1.2","addr":"h:0","path":"","protocol":1}`)
	f.Add("x", `not json`)
	f.Fuzz(func(t *testing.T, id, raw string) {
		rec, err := DecodeRecord(id, raw)
		if err != nil {
			return
		}
		if rec.ID != id || CheckPool(rec.Pool) != nil || strings.Contains(rec.Pool, groupSep) {
			t.Fatalf("%q decoded into %+v", raw, rec)
		}
		if rec.check() != nil {
			t.Fatalf("%q decoded into a record its own check refuses: %v", raw, rec.check())
		}
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeRecord(id, string(b))
		if err != nil {
			t.Fatalf("%q decoded, but its encoding %s does not: %v", raw, b, err)
		}
		if again.Addr != rec.Addr || again.Path != rec.Path || again.Group() != rec.Group() {
			t.Fatalf("%q reads back as %+v", raw, again)
		}
	})
}
