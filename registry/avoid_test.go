package registry

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestClaimAvoids: a claim walks past the workers its request avoids, for
// every policy of the table: it takes another worker when there is one,
// and none (NoWorkerError, saying how many workers the pool has) when
// every worker is avoided. An avoided worker
// is not blamed: once nobody avoids it, claims take it again. A request
// with too many or malformed IDs fails before Redis.
func TestClaimAvoids(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	ids := []string{"w1", "w2", "w3"}
	for _, p := range Policies() {
		t.Run(string(p.Name), func(t *testing.T) {
			pool := "avoid-" + strings.ReplaceAll(string(p.Name), "_", "-")
			for _, id := range ids {
				register(t, r, pool, id, 4)
			}
			req := func(avoid ...string) ClaimRequest {
				return ClaimRequest{Pool: pool, Policy: p.Name, Avoid: avoid}
			}
			// what this policy takes with nothing avoided (Pick claims nothing)
			first, _, err := r.Pick(ctx, req())
			if err != nil {
				t.Fatalf("pick: %v", err)
			}
			c, err := r.Claim(ctx, req(first.ID))
			if err != nil {
				t.Fatalf("claim avoiding %s: %v", first.ID, err)
			}
			if c.Worker.ID == first.ID {
				t.Errorf("claim avoiding %s took it", first.ID)
			}
			if err := r.Release(ctx, pool, c.LeaseID); err != nil {
				t.Fatal(err)
			}
			_, err = r.Claim(ctx, req(ids...))
			var nw *NoWorkerError
			if !errors.As(err, &nw) {
				t.Fatalf("claim avoiding every worker: %v, want a NoWorkerError", err)
			}
			// what the caller reads to tell "nothing else to try" from
			// "others are busy": here the avoided ones are all there is
			if nw.Registered != len(ids) {
				t.Errorf("NoWorkerError.Registered = %d, want the pool's %d workers", nw.Registered, len(ids))
			}
			// avoiding is not suspicion: a claim avoiding the others takes it
			c, err = r.Claim(ctx, req(without(ids, first.ID)...))
			if err != nil || c.Worker.ID != first.ID {
				t.Fatalf("claim avoiding all but %s: %v, %v", first.ID, c, err)
			}
			if err := r.Release(ctx, pool, c.LeaseID); err != nil {
				t.Fatal(err)
			}
		})
	}
	for name, avoid := range map[string][]string{
		"too many":   make([]string, MaxAvoid+1),
		"empty id":   {""},
		"with space": {"w1 w2"},
	} {
		if name == "too many" {
			for i := range avoid {
				avoid[i] = "w1"
			}
		}
		_, err := r.Claim(ctx, ClaimRequest{Pool: "avoid-bad", Policy: LifetimeFirst, Avoid: avoid})
		if err == nil || !strings.Contains(err.Error(), "avoid") {
			t.Errorf("%s: claim error %v, want one naming the workers to avoid", name, err)
		}
	}
}

func without(ss []string, drop string) []string {
	var out []string
	for _, s := range ss {
		if s != drop {
			out = append(out, s)
		}
	}
	return out
}
