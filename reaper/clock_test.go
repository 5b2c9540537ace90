package reaper

import (
	"context"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// TestReaperWithAClockBehindRedisStillExpiresStaleWorkers: a Caddy host
// whose clock runs behind Redis' (an NTP step back, a VM resumed from a
// snapshot) must still reap a worker whose record lapsed in Redis' time at
// its first pass (reliability.md: "gone by the reaper's first pass after
// they turn stale"). It picked no candidate while candidates were chosen
// with the local clock.
func TestReaperWithAClockBehindRedisStillExpiresStaleWorkers(t *testing.T) {
	reg, _ := newRegistry(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := reg.Register(ctx, registry.Registration{Pool: "p", ID: "dead", Addr: "127.0.0.1:1", Path: "/", TTL: 500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // no heartbeat: the record lapsed in Redis' time

	// Control: the same pass with a right clock removes it (pool "q").
	if err := reg.Register(ctx, registry.Registration{Pool: "q", ID: "dead", Addr: "127.0.0.1:1", Path: "/", TTL: 500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	right := &Reaper{Registry: reg, StaleAfter: 2 * time.Second}
	if rep, err := right.RunOnce(ctx); err != nil || len(rep.Expired) != 2 {
		t.Fatalf("control: a reaper with a right clock expired %v (err %v), want p/dead and q/dead", rep.Expired, err)
	}

	// The same again, reaped by a Caddy whose clock is 10 min behind Redis'.
	if err := reg.Register(ctx, registry.Registration{Pool: "p", ID: "dead2", Addr: "127.0.0.1:1", Path: "/", TTL: 500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	skew := -10 * time.Minute
	r := &Reaper{Registry: reg, StaleAfter: 2 * time.Second}
	r.now = func() time.Time { return time.Now().Add(skew) }
	rep, err := r.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Expired) != 1 {
		info, _ := reg.Inspect(ctx, "p")
		t.Fatalf("reaper with its clock %s behind Redis: expired %v, want [p/dead2] (record lapsed in Redis' time; %d workers still registered)",
			-skew, rep.Expired, len(info.Workers))
	}
}
