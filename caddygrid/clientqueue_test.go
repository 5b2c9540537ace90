package caddygrid_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestClientLimitBoundsWaiters: client_limit stops one client from taking
// every browser, and must also stop it from taking every place in the
// queue. With the pool busy, client A (holding no session, so under its
// limit of 2) sends as many requests as the queue holds; without a bound
// they all wait and every other client gets 429 "too many clients
// waiting" until A's requests are served or time out. A client may have
// at most client_limit requests waiting (it can be served no more): A's
// others get 429 naming the limit at once, and client C still queues.
func TestClientLimitBoundsWaiters(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			max_concurrent 1
			queue_size 4
			select_timeout 30s
			client_limit 2
			client_key {http.request.header.X-Client}
		}
	}`})
	u := c.url("/playwright/chromium")
	var ct clientTally
	// B holds the only slot.
	b := ct.mustServe(t, u, "client-B")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type answer struct {
		client string
		s      *session
		err    error
	}
	answers := make(chan answer, 8)
	send := func(client string) {
		h := http.Header{}
		h.Set("X-Client", client)
		go func() {
			s, err := dialHeader(ctx, u, h)
			answers <- answer{client, s, err}
		}()
	}
	const flood = 4 // as many as the queue holds
	for range flood {
		send("client-A")
	}
	depth := func() float64 { return c.metric(`caddy_grid_queue_depth{pool="chromium"}`) }
	// A's requests that were let in are waiting and the others answered.
	aRefused := 0
	testenv.Eventually(t, 15*time.Second, "client A's requests to wait or be refused", func() bool {
		for {
			select {
			case a := <-answers:
				he := refusal(a.err)
				if a.err == nil || he == nil || he.StatusCode != http.StatusTooManyRequests {
					t.Fatalf("client A's request while the pool is busy: session %v, error %v; want it to wait or get 429", a.s != nil, a.err)
				}
				if !strings.Contains(string(he.Body), "client limit") {
					t.Fatalf("client A refused with %q; want the client limit named", he.Body)
				}
				aRefused++
				continue
			default:
			}
			break
		}
		return int(depth())+aRefused == flood
	})
	aWaiting := int(depth())
	// C must still find a place in the queue.
	send("client-C")
	cQueued := false
	testenv.Eventually(t, 15*time.Second, "client C to queue or be answered", func() bool {
		select {
		case a := <-answers:
			he := refusal(a.err)
			t.Fatalf("client C answered while the pool is busy (session %v): %v; want it queued (client A took the queue: %d of A's %d requests waiting)",
				a.s != nil, he, aWaiting, flood)
		default:
		}
		cQueued = int(depth()) == aWaiting+1
		return cQueued
	})
	t.Logf("client A tried %d, waiting %d, refused 429 %d; client C queued %v", flood, aWaiting, aRefused, cQueued)
	if aWaiting > 2 {
		t.Errorf("client A has %d requests waiting, past its client_limit of 2", aWaiting)
	}
	b.close()
	cancel()
}
