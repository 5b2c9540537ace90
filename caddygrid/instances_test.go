package caddygrid_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// Two Caddy instances share one Redis and two workers with
// max_concurrent 2: eight clients at once, half through each instance,
// are all served in turn, no worker ever holds more than two sessions
// (as its agent counts them), and every slot is free again after.
func TestTwoInstancesOnOneRedisNeverPushAWorkerPastMaxConcurrent(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	a1, a2 := g.agent("chromium", nil), g.agent("chromium", nil)
	opts := caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2\n\t\t\tselect_timeout 15s")}
	instances := []*caddy{startCaddy(t, opts), startCaddy(t, opts)}
	peaks := samplePeaks(a1, a2)

	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			s, err := dial(context.Background(), instances[i%2].url("/playwright/chromium"))
			if err != nil {
				errs <- fmt.Errorf("client %d: %w", i, err)
				return
			}
			defer s.close()
			for range 3 {
				if err := s.echo(fmt.Sprintf("client %d", i)); err != nil {
					errs <- fmt.Errorf("client %d: %w", i, err)
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	testenv.Eventually(t, 5*time.Second, "every slot is free", func() bool {
		return a1.active(t) == 0 && a2.active(t) == 0 && g.active("chromium") == 0 && len(g.sessions(t, "chromium")) == 0
	})
	p := peaks.finish()
	if len(p) != 2 {
		t.Errorf("sampled workers %v, want both", p)
	}
	served := 0
	for id, n := range p {
		if n > 2 {
			t.Errorf("worker %s held %d sessions at once, max_concurrent is 2", id, n)
		}
		served += n
	}
	if served < 4 {
		t.Errorf("peaks %v: the workers were never both full, the test did not load them", p)
	}
	life := 0
	for _, a := range []*agent{a1, a2} {
		for _, b := range a.status(t).Browsers {
			life += b.Lifetime
		}
	}
	if life != 8 {
		t.Errorf("the workers served %d sessions, want 8", life)
	}
}
