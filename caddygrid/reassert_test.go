package caddygrid_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// oneProcessWorker starts a fake browser and registers it as worker w1 of
// pool chromium (capacity 2) with generation gen, as its agent would, and
// returns the registration, which the agent repeats after a loss.
func oneProcessWorker(t *testing.T, g *grid, gen string) registry.Registration {
	t.Helper()
	return processWorker(t, g, "chromium", "w1", gen)
}

// processWorker is oneProcessWorker's worker id in pool.
func processWorker(t *testing.T, g *grid, pool, id, gen string) registry.Registration {
	t.Helper()
	srv, ep, err := fake.Start("127.0.0.1:0", fake.Options{Path: "/playwright"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	u, err := url.Parse(ep)
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.Registration{Pool: pool, ID: id, BrowserType: "chromium", Addr: u.Host, Path: u.Path,
		Capacity: 2, TTL: workerTTL, Generation: gen}
	if err := g.reg.Register(context.Background(), reg); err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestSessionsSurviveAnEmptyRedis: Redis loses everything (FLUSHALL, as an
// empty restart would) under two live sessions on a worker of capacity 2.
// The worker's agent registers again with the same generation; the Caddy
// holding the sessions re-asserts their leases at its next renewal, so
// within one renewal period the worker counts its two sessions and its
// lifetime again, and a third session is refused (no over-admission).
func TestSessionsSurviveAnEmptyRedis(t *testing.T) {
	g := newGrid(t)
	reg := oneProcessWorker(t, g, "browser-process-1")
	ctx := context.Background()
	const leaseTTL = 3 * time.Second
	renewalPeriod := leaseTTL / 3
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), global: "lease_ttl 3s", site: `
	route /playwright/* {
		browser_grid chromium {
			select_timeout 300ms
		}
	}`})

	a := mustDial(t, c.url("/playwright/chromium"))
	b := mustDial(t, c.url("/playwright/chromium"))
	if w := g.info("chromium", "w1"); w.Active != 2 || w.Lifetime != 2 {
		t.Fatalf("before the flush: active %d lifetime %d", w.Active, w.Lifetime)
	}

	if err := g.rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// The agent's next heartbeat finds no record and registers again (it
	// would also re-assert the lifetime it last saw; 0 here, so only the
	// renewals can bring it back).
	if err := g.reg.Register(ctx, reg); err != nil {
		t.Fatal(err)
	}
	flushed := time.Now()
	var w registry.WorkerInfo
	testenv.Eventually(t, 10*time.Second, "the worker's counts re-asserted", func() bool {
		w = g.info("chromium", "w1")
		return w.Active == 2 && w.Lifetime == 2
	})
	healed := time.Since(flushed)
	t.Logf("counts back %s after the flush (renewal period %s)", healed.Round(time.Millisecond), renewalPeriod)
	// The bound: healed within one renewal period (plus slack for
	// this shared machine's scheduling).
	if healed > renewalPeriod+500*time.Millisecond {
		t.Fatalf("counts came back %s after the flush; want within one renewal period (%s)", healed, renewalPeriod)
	}
	// Caddy counts the re-asserted leases once the renewal's reply is
	// back, which can be just after Redis shows the counts.
	reasserted := func() float64 { return c.metric(`caddy_grid_leases_reasserted_total{pool="chromium"}`) }
	testenv.Eventually(t, 5*time.Second, "leases_reasserted_total counting the renewal", func() bool { return reasserted() != 0 })
	if n := reasserted(); n != 2 {
		t.Fatalf("leases_reasserted_total %v, want 2", n)
	}

	// Capacity 2 holds: a third session is refused.
	if s, err := dial(ctx, c.url("/playwright/chromium")); err == nil {
		s.close()
		t.Fatal("a third session was admitted onto capacity 2 after the flush")
	} else if he := refusal(err); he == nil || he.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("third session: %v, want 503", err)
	}
	for _, s := range []*session{a, b} {
		if err := s.echo("still here"); err != nil {
			t.Fatal(err)
		}
		s.close()
	}
	testenv.Eventually(t, 10*time.Second, "both sessions released", func() bool {
		w = g.info("chromium", "w1")
		return w.Active == 0
	})
	if w.Lifetime != 2 {
		t.Fatalf("lifetime %d after both sessions ended, want 2", w.Lifetime)
	}
}

// TestLostClaimRepliesLeaveNothing: Redis runs the claims but their
// replies are lost (the connection drops before the reply reaches Caddy,
// for every retry), so the client gets 503 or is served by a later claim;
// once replies flow again, every claim whose reply was lost has been
// cancelled: no lease, no active count, no lifetime spent beyond the
// sessions really served.
func TestLostClaimRepliesLeaveNothing(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	px := startReplyDropper(t, g.redis.Addr)
	c := startCaddy(t, caddyOpts{redisURL: "redis://" + px.addr + "/0", global: "lease_ttl 60s", site: `
	route /playwright/* {
		browser_grid chromium {
			select_timeout 300ms
		}
	}`})
	ctx := context.Background()
	// One session first: the function library gets loaded (FCALL runs
	// it from then on) and lifetime has a baseline of 1.
	mustDial(t, c.url("/playwright/chromium")).close()
	testenv.Eventually(t, 10*time.Second, "the first session released", func() bool { return g.info("chromium", "w1").Active == 0 })

	px.drop.Store(true)
	_, err := dial(ctx, c.url("/playwright/chromium"))
	if he := refusal(err); he == nil || he.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("session while every reply is lost: %v, want 503", err)
	}
	// Redis ran what it answered: a reply dropped on its way back proves
	// the claim (the first call after drop was set) ran. (Its lifetime
	// cannot show it: the background Cancel may already have given it back.)
	ran := px.dropped.Load()
	if ran == 0 {
		t.Fatal("no reply was dropped while the replies were lost: the claims did not run, the test proves nothing")
	}
	px.drop.Store(false)
	var info registry.PoolInfo
	testenv.Eventually(t, 30*time.Second, "the claims whose replies were lost cancelled", func() bool {
		info, err = g.reg.Inspect(ctx, "chromium")
		return err == nil && info.Leases == 0 && len(info.Workers) == 1 &&
			info.Workers[0].Active == 0 && info.Workers[0].Lifetime == 1
	})
	t.Logf("%d replies lost (claims and their cancellations); all cancelled (caddy_grid_claims_cancelled_total %v)",
		ran, c.metric(`caddy_grid_claims_cancelled_total{pool="chromium"}`))

	// Replies flow again: a session is served and counted once.
	s := mustDial(t, c.url("/playwright/chromium"))
	if w := g.info("chromium", "w1"); w.Active != 1 || w.Lifetime != 2 {
		t.Fatalf("after a served session: active %d lifetime %d", w.Active, w.Lifetime)
	}
	s.close()
}

// replyDropper is a TCP proxy in front of Redis that, while drop is set,
// forwards requests but drops the connection instead of forwarding a reply
// (a reply lost on the way back), and while cutOn is set drops it instead
// of forwarding a request that holds those bytes.
type replyDropper struct {
	addr string
	drop atomic.Bool
	// dropped counts the replies dropped.
	dropped atomic.Int64
	// cutOn, while set, drops the connection instead of forwarding a
	// request that holds it (a call that never reaches Redis).
	cutOn atomic.Pointer[[]byte]
	// cut counts the requests cut so.
	cut atomic.Int64
	// cutAfter holds a request that cutOn matches this long before
	// dropping its connection (a call that hangs, then fails); holding
	// counts the requests held so now.
	cutAfter, holding atomic.Int64
	// delay (ns) holds every chunk of replies back that long: a slow link.
	delay atomic.Int64
}

func startReplyDropper(t *testing.T, target string) *replyDropper {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	p := &replyDropper{addr: l.Addr().String()}
	go func() {
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			go func() {
				defer client.Close()
				defer server.Close()
				buf := make([]byte, 32<<10)
				var tail []byte // a pattern may straddle two reads
				for {
					n, err := client.Read(buf)
					if n > 0 {
						if pat := p.cutOn.Load(); pat != nil && bytes.Contains(append(tail, buf[:n]...), *pat) {
							p.cut.Add(1)
							p.holding.Add(1)
							time.Sleep(time.Duration(p.cutAfter.Load()))
							p.holding.Add(-1)
							return
						}
						if _, werr := server.Write(buf[:n]); werr != nil {
							return
						}
						tail = append(tail[:0], buf[max(0, n-64):n]...)
					}
					if err != nil {
						return
					}
				}
			}()
			go func() {
				defer client.Close()
				defer server.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := server.Read(buf)
					if n > 0 {
						if p.drop.Load() {
							p.dropped.Add(1)
							return
						}
						time.Sleep(time.Duration(p.delay.Load()))
						if _, werr := client.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}

// TestEndedLeaseIsCountedOnce: a live session's lease ended by someone else
// (released outside this Caddy) is reported once and no longer renewed,
// not re-counted at every renewal for the rest of the session, and not
// brought back.
func TestEndedLeaseIsCountedOnce(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), global: "lease_ttl 1s", site: `
	route /playwright/* {
		browser_grid chromium
	}`})
	ctx := context.Background()
	a := mustDial(t, c.url("/playwright/chromium"))
	defer a.close()
	b := mustDial(t, c.url("/playwright/chromium"))
	defer b.close()
	const expiry = "{grid:chromium}:lease_expiry"
	ids, err := g.rdb.ZRange(ctx, expiry, 0, -1).Result()
	if err != nil || len(ids) != 2 {
		t.Fatalf("leases: %v %v", ids, err)
	}
	ended, clock := ids[0], ids[1]
	if err := g.reg.Release(ctx, "chromium", ended); err != nil {
		t.Fatal(err)
	}
	const lost = `caddy_grid_leases_lost_total{pool="chromium"}`
	testenv.Eventually(t, 10*time.Second, "the ended lease reported", func() bool { return c.metric(lost) == 1 })
	// Two more renewals (the other lease's expiry moves on each time).
	for range 2 {
		last, err := g.rdb.ZScore(ctx, expiry, clock).Result()
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, "a renewal", func() bool {
			s, err := g.rdb.ZScore(ctx, expiry, clock).Result()
			return err == nil && s > last
		})
	}
	if n := c.metric(lost); n != 1 {
		t.Fatalf("leases_lost_total %v after more renewals, want 1 (counted once)", n)
	}
	// (lease_owner has one entry per live lease; lease_expiry also holds
	// the ended lease's tombstone until it is forgotten)
	if n, _ := g.rdb.ZCard(ctx, "{grid:chromium}:lease_owner").Result(); n != 1 {
		t.Fatalf("%d leases in Redis, want 1: the ended one must not come back", n)
	}
	if err := a.echo("still here"); err != nil {
		t.Fatal(err)
	}
}
