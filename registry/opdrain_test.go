package registry

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestOperatorDrainTakesNoNewSession: an operator's Drain (the admin API's
// drain) takes the worker out of selection at once, for every policy of
// the table, not at its agent's next heartbeat (10 s by default). It stays
// out while the command is live: through the release of a session it
// held, a heartbeat (the agent hearing the command), and the reaper's
// reconcile, which must find nothing to fix. A command that lapses unheard
// (its agent never heartbeated within CommandTTL) gives the worker back to
// claims at its next heartbeat, as the command is gone.
func TestOperatorDrainTakesNoNewSession(t *testing.T) {
	ctx := context.Background()
	const ttl = 1500 * time.Millisecond
	r, _ := startRegistry(t, Options{CommandTTL: ttl})
	ids := []string{"w1", "w2", "w3"}
	for _, p := range Policies() {
		t.Run(string(p.Name), func(t *testing.T) {
			pool := "opdrain-" + strings.ReplaceAll(string(p.Name), "_", "-")
			for _, id := range ids {
				register(t, r, pool, id, 4)
			}
			req := func(avoid ...string) ClaimRequest {
				return ClaimRequest{Pool: pool, Policy: p.Name, Avoid: avoid}
			}
			// the worker this policy takes first, with a session on it
			held, err := r.Claim(ctx, req())
			if err != nil {
				t.Fatalf("claim: %v", err)
			}
			x := held.Worker.ID
			others := without(ids, x)
			if err := r.Drain(ctx, pool, x); err != nil {
				t.Fatal(err)
			}
			// only x may be taken: nothing may be
			noneFor := func(when string) {
				t.Helper()
				c, err := r.Claim(ctx, req(others...))
				var nw *NoWorkerError
				if !errors.As(err, &nw) {
					t.Fatalf("%s: a claim that could only take drained %s: %+v, %v; want a NoWorkerError", when, x, c, err)
				}
			}
			noneFor("right after the drain")
			// the other workers still serve
			c, err := r.Claim(ctx, req())
			if err != nil || c.Worker.ID == x {
				t.Fatalf("claim after draining %s: %+v, %v; want another worker", x, c, err)
			}
			if err := r.Release(ctx, pool, c.LeaseID); err != nil {
				t.Fatal(err)
			}
			// a release of its own session reindexes it: it stays out
			if err := r.Release(ctx, pool, held.LeaseID); err != nil {
				t.Fatal(err)
			}
			noneFor("after its session was released")
			res, err := r.Reconcile(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			if res.CountersFixed != 0 || res.OrphansRemoved != 0 {
				t.Errorf("reconcile of a drained worker fixed %d and removed %d, want nothing", res.CountersFixed, res.OrphansRemoved)
			}
			noneFor("after the reaper's reconcile")
			hb, err := r.Heartbeat(ctx, pool, x, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if hb.Command != CommandShutdown {
				t.Errorf("heartbeat of drained %s: command %q, want shutdown", x, hb.Command)
			}
			noneFor("after its heartbeat")
			// unheard: the agent acts on no command that lapsed, so neither
			// do claims
			time.Sleep(ttl + 200*time.Millisecond)
			if hb, err = r.Heartbeat(ctx, pool, x, time.Minute); err != nil || hb.Command != "" {
				t.Fatalf("heartbeat once the command lapsed: %+v, %v; want no command", hb, err)
			}
			c, err = r.Claim(ctx, req(others...))
			if err != nil || c.Worker.ID != x {
				t.Fatalf("claim of %s once its command lapsed: %+v, %v", x, c, err)
			}
			if err := r.Release(ctx, pool, c.LeaseID); err != nil {
				t.Fatal(err)
			}
		})
	}
}
