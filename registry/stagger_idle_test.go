package registry

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// A max_lifetime lowered below the lifetimes of several workers, one of
// them holding a long session: the worker draining that session does not
// hold the restart turn, so the others past the limit restart one at a
// time meanwhile and the pool serves again after one restart, not after
// the long session. (A red team: the busy worker's heartbeat came first,
// it took the turn and held it for its whole drain; the idle workers past
// the limit waited behind it, the one below the limit took sessions up to
// its last, which stagger_drains holds back, and the pool served nothing
// for 17.5 s.)
func TestLoweredMaxLifetimeDoesNotWaitForALongSession(t *testing.T) {
	r, _ := startRegistry(t, Options{})
	ctx := context.Background()
	const pool = "idlefirst"
	a := &agents{t: t, r: r, pool: pool, ids: []string{"a", "b", "c", "d"}}
	for _, id := range a.ids {
		register(t, r, pool, id, 0)
	}
	req := ClaimRequest{Pool: pool, Policy: LifetimeFirst, ConfigTime: time.Now().Add(-time.Hour),
		Limits: selection.Limits{MaxLifetime: 40, StaleAfter: 30 * time.Second, StaggerDrains: true}}
	serveSessions(t, r, req, 45)
	long, err := r.Claim(ctx, req) // the long session: on the highest lifetime
	if err != nil {
		t.Fatal(err)
	}
	busy := long.Worker.ID
	// The limit lowered to 5, brought by one claim of the new config.
	req.Limits.MaxLifetime = 5
	req.ConfigTime = time.Now()
	serveSessions(t, r, req, 1)
	idleSpent := 0
	for id, f := range counts(t, r, pool) {
		if id != busy && f[1] >= 5 && f[0] == 0 { // [active, lifetime]
			idleSpent++
		}
	}
	if idleSpent == 0 {
		t.Fatalf("no idle worker past the lowered limit beside the busy %s: the test shows nothing; %v", busy, counts(t, r, pool))
	}
	// The busy worker heartbeats first: it is told to drain, and drains
	// its long session; an idle one past the limit restarts meanwhile.
	i := slices.Index(a.ids, busy)
	a.ids[0], a.ids[i] = a.ids[i], a.ids[0]
	a.heartbeat()
	if w, err := r.Worker(ctx, pool, busy); err != nil || w.Status != selection.Draining || w.Active != 1 {
		t.Fatalf("the busy worker past the limit: %+v, %v; want draining its session", w, err)
	}
	if a.next == 0 {
		t.Fatalf("no idle worker past the limit restarted while the busy one drained; retiring %v, pool %v", a.retiring(), counts(t, r, pool))
	}
	// The rest, one restart at a time; every claim served.
	for round := 0; ; round++ {
		if ret := a.restarting(); len(ret) > 1 {
			t.Fatalf("round %d: %d workers restarting at once: %v", round, len(ret), ret)
		}
		serveSessions(t, r, req, 1)
		if a.next >= idleSpent {
			break
		}
		if round > 20 {
			t.Fatalf("the idle workers past the limit not all restarted after %d rounds (%d of %d)", round, a.next, idleSpent)
		}
		a.heartbeat()
	}
	if err := r.Release(ctx, pool, long.LeaseID); err != nil {
		t.Fatal(err)
	}
	a.heartbeat()
	a.heartbeat()
	if _, err := r.Worker(ctx, pool, busy); err == nil {
		t.Fatalf("the busy worker, idle now and draining, did not restart: %v", counts(t, r, pool))
	}
}
