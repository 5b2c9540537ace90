package registry

import (
	"context"
	"testing"
	"time"
)

// The reaper lock lives its TTL, renewed for as long as its holder has not
// released it: a pass longer than the TTL keeps it, a holder that dies
// mid-pass (nothing renews) loses it within the TTL, and a release gives
// it back at once. Before, the lock was set once, so a short TTL would let
// a long pass lose it, and a long one (60 s) kept a killed instance's pool
// locked that long: TestLeasesLiveWithTheSocket, whose killed Caddy ran a
// reaper pass every 200 ms, once waited out its 15 s for the other
// instance's reaper.
func TestReaperLockRenewsUntilReleased(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	const ttl = 300 * time.Millisecond
	key := r.Key("p", keyReaperLock)

	release, ok, err := r.ReaperLock(ctx, "p", ttl)
	if err != nil || !ok {
		t.Fatalf("taking the lock: %v, %v", ok, err)
	}
	time.Sleep(4 * ttl)
	if _, ok2, err := r.ReaperLock(ctx, "p", ttl); err != nil || ok2 {
		t.Fatalf("another reaper took the lock after %s while its holder lives: %v, %v", 4*ttl, ok2, err)
	}
	if left := r.rdb.PTTL(ctx, key).Val(); left <= 0 || left > ttl {
		t.Fatalf("the lock's TTL %s, want (0, %s]", left, ttl)
	}
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := r.rdb.Exists(ctx, key).Val(); n != 0 {
		t.Fatal("the lock is still there after its release")
	}

	// A holder that died: its lock, set and never renewed, is free again
	// within its TTL.
	if err := r.rdb.Set(ctx, key, "dead-holder", ttl).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl + 100*time.Millisecond)
	release, ok, err = r.ReaperLock(ctx, "p", ttl)
	if err != nil || !ok {
		t.Fatalf("the lock of a dead holder after its TTL: %v, %v", ok, err)
	}
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
}
