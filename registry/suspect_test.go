package registry

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestSuspectWithoutLease: Suspect marks a worker suspect without a lease
// (its claim was given back before the proof of its fault came), for every
// policy of the table: claims walk past it while another worker is free,
// its counts are untouched, a shorter suspicion does not shorten a longer
// one, a worker registered again since (another generation) is left
// alone, and a worker that is gone is ErrNotRegistered.
func TestSuspectWithoutLease(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	for _, p := range Policies() {
		t.Run(string(p.Name), func(t *testing.T) {
			pool := "suspect-" + strings.ReplaceAll(string(p.Name), "_", "-")
			register(t, r, pool, "w1", 4)
			register(t, r, pool, "w2", 4)
			req := ClaimRequest{Pool: pool, Policy: p.Name}
			bad, gen := claimGivenBack(t, r, req)
			other := map[string]string{"w1": "w2", "w2": "w1"}[bad]
			if err := r.Suspect(ctx, pool, bad, gen, time.Hour); err != nil {
				t.Fatalf("Suspect: %v", err)
			}
			for range 3 {
				c, err := r.Claim(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				if c.Worker.ID != other {
					t.Fatalf("claim took %s, suspect for an hour; want %s", c.Worker.ID, other)
				}
				if err := r.Release(ctx, pool, c.LeaseID); err != nil {
					t.Fatal(err)
				}
			}
			w, err := r.Worker(ctx, pool, bad)
			if err != nil {
				t.Fatal(err)
			}
			if until := time.Until(w.SuspectUntil); until < 59*time.Minute || until > time.Hour {
				t.Errorf("%s suspect for %v more, want about an hour", bad, until.Round(time.Second))
			}
			if w.Active != 0 || w.Lifetime != 0 {
				t.Errorf("%s: active %d, lifetime %d after its claim was undone and it was marked suspect; want 0, 0",
					bad, w.Active, w.Lifetime)
			}
			// a shorter suspicion keeps the longer one
			if err := r.Suspect(ctx, pool, bad, gen, time.Millisecond); err != nil {
				t.Fatal(err)
			}
			if w, _ := r.Worker(ctx, pool, bad); time.Until(w.SuspectUntil) < 59*time.Minute {
				t.Errorf("a 1 ms suspicion cut an hour's to %v", time.Until(w.SuspectUntil).Round(time.Second))
			}

			// registered again with another generation (a new browser):
			// the old registration's fault is not the new one's
			if err := r.Register(ctx, Registration{Pool: pool, ID: bad, BrowserType: "chromium",
				Addr: "127.0.0.1:92", Path: "/playwright", Capacity: 4, TTL: time.Minute}); err != nil {
				t.Fatal(err)
			}
			if err := r.Suspect(ctx, pool, bad, gen, time.Hour); err != nil {
				t.Fatalf("Suspect of an older generation: %v, want nil (left alone)", err)
			}
			if w, _ := r.Worker(ctx, pool, bad); w.SuspectUntil.After(time.Now()) {
				t.Errorf("%s registered again, then suspect until %v for its old generation's fault", bad, w.SuspectUntil)
			}

			err = r.Suspect(ctx, pool, "gone", gen, time.Hour)
			if !errors.Is(err, ErrNotRegistered) || !strings.Contains(err.Error(), `"gone"`) {
				t.Errorf("Suspect of a missing worker: %v, want ErrNotRegistered naming it", err)
			}
		})
	}
}

// claimGivenBack claims under req and gives the claim back unblamed, as a
// retry does before it waits in the queue: the worker it had, and the
// registration's generation.
func claimGivenBack(t *testing.T, r *Registry, req ClaimRequest) (id, gen string) {
	t.Helper()
	ctx := context.Background()
	c, err := r.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Undo(ctx, req.Pool, c.LeaseID, 0); err != nil {
		t.Fatal(err)
	}
	return c.Worker.ID, c.Gen
}
