package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// The figures of issue 3's contention proof.
const (
	contWorkers    = 10
	contClaims     = 500 // per process
	contConcurrent = 5
	contLifetime   = 50
)

// claimerReport is what one process saw.
type claimerReport struct {
	Granted, Refused int
	Errors           []string
	// Kept lists the worker of every lease held at the end (not released).
	Kept []string
	// Over lists claims that reported active > max_concurrent or
	// lifetime > max_lifetime after themselves.
	Over []string
	// Drains counts claims that brought a worker to the lifetime limit.
	Drains int
	// MaxActive is the highest active count a claim saw after itself.
	MaxActive int
}

// claimers runs n concurrent claims against the pool, each holding its slot
// for a moment and then releasing it, except every 50th, kept to the end.
func claimers(url, policy string, n int, seed uint64) claimerReport {
	rdb, err := NewClient(url)
	if err != nil {
		return claimerReport{Errors: []string{err.Error()}}
	}
	defer rdb.Close()
	r := New(rdb, Options{})
	ctx := context.Background()
	var mu sync.Mutex
	var rep claimerReport
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			<-start
			// Arrivals spread over 400 ms, so sessions turn over and the
			// workers reach their lifetime limit while claims still race.
			time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
			// A refused claim waits and tries again for a while, as a
			// queued client would: so the workers reach their limits on a
			// loaded machine too, where the first try of every claim may
			// find all slots busy. Only a claim still refused then counts.
			var c *Claim
			var err error
			for deadline := time.Now().Add(5 * time.Second); ; {
				c, err = r.Claim(ctx, ClaimRequest{Pool: "busy", Policy: Policy(policy), Holder: fmt.Sprint("claimer-", seed),
					Limits: selection.Limits{MaxConcurrent: contConcurrent, MaxLifetime: contLifetime}, Rand: &lockedRand{r: rng}})
				if !errors.Is(err, ErrNoWorker) || time.Now().After(deadline) {
					break
				}
				time.Sleep(time.Duration(5+rng.IntN(10)) * time.Millisecond)
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, ErrNoWorker):
				rep.Refused++
				return
			case err != nil:
				rep.Errors = append(rep.Errors, err.Error())
				return
			}
			rep.Granted++
			rep.MaxActive = max(rep.MaxActive, c.Worker.Active)
			if c.Drain {
				rep.Drains++
			}
			if c.Worker.Active > contConcurrent || c.Worker.Lifetime > contLifetime {
				rep.Over = append(rep.Over, fmt.Sprintf("%s active %d lifetime %d", c.Worker.ID, c.Worker.Active, c.Worker.Lifetime))
			}
			if i%50 == 0 {
				rep.Kept = append(rep.Kept, c.Worker.ID)
				return
			}
			mu.Unlock()
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond) // the session
			err = r.Release(ctx, "busy", c.LeaseID)
			mu.Lock()
			if err != nil {
				rep.Errors = append(rep.Errors, err.Error())
			}
		}()
	}
	close(start)
	wg.Wait()
	return rep
}

type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func (l *lockedRand) Uint64() uint64 { l.mu.Lock(); defer l.mu.Unlock(); return l.r.Uint64() }
func (l *lockedRand) IntN(n int) int { l.mu.Lock(); defer l.mu.Unlock(); return l.r.IntN(n) }

// contentionHelper is the second process of TestContention: TestMain
// runs it instead of the tests when the test binary is re-executed with
// GRID_CONTENTION_URL set.
func contentionHelper(url string) {
	rep := claimers(url, os.Getenv("GRID_CONTENTION_POLICY"), contClaims, 2)
	b, _ := json.Marshal(rep)
	fmt.Printf("REPORT %s\n", b)
}

// Two processes x 500 concurrent claims on 10 workers with max_concurrent 5
// and max_lifetime 50: no worker ever exceeds either limit, every claim is
// granted or refused, lifetimes add up to the grants, and at the end each
// worker's active count equals the leases still held on it.
func TestContention(t *testing.T) {
	for _, policy := range []Policy{LifetimeFirst, Vnode, FairShare} {
		t.Run(string(policy), func(t *testing.T) {
			ctx := context.Background()
			r, _ := startRegistry(t, Options{})
			srvURL := redisURL(r)
			for i := range contWorkers {
				register(t, r, "busy", fmt.Sprintf("w%d", i), 0)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.count=1")
			cmd.Env = append(os.Environ(), "GRID_CONTENTION_URL="+srvURL, "GRID_CONTENTION_POLICY="+string(policy))
			var other claimerReport
			done := make(chan error, 1)
			go func() {
				out, err := cmd.CombinedOutput()
				if err == nil {
					var line []byte
					for _, l := range splitLines(out) {
						if len(l) > 7 && string(l[:7]) == "REPORT " {
							line = l[7:]
						}
					}
					if line == nil {
						err = fmt.Errorf("helper printed no report:\n%s", out)
					} else {
						err = json.Unmarshal(line, &other)
					}
				} else {
					err = fmt.Errorf("helper: %v\n%s", err, out)
				}
				done <- err
			}()
			mine := claimers(srvURL, string(policy), contClaims, 1)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			granted := mine.Granted + other.Granted
			t.Logf("%s: granted %d + %d, refused %d + %d, drains %d", policy, mine.Granted, other.Granted, mine.Refused, other.Refused, mine.Drains+other.Drains)
			for _, rep := range []claimerReport{mine, other} {
				if len(rep.Errors) > 0 {
					t.Fatalf("claim errors: %v", rep.Errors[:min(5, len(rep.Errors))])
				}
				if len(rep.Over) > 0 {
					t.Fatalf("limits exceeded: %v", rep.Over)
				}
				if rep.Granted+rep.Refused != contClaims {
					t.Fatalf("granted %d + refused %d != %d claims", rep.Granted, rep.Refused, contClaims)
				}
			}
			info, err := r.Inspect(ctx, "busy")
			if err != nil {
				t.Fatal(err)
			}
			kept := map[string]int{}
			for _, id := range append(mine.Kept, other.Kept...) {
				kept[id]++
			}
			lifetimes, drained := 0, 0
			for _, w := range info.Workers {
				if w.Active != kept[w.ID] {
					t.Errorf("%s: active %d, but %d leases are held on it", w.ID, w.Active, kept[w.ID])
				}
				if w.Active > contConcurrent || w.Lifetime > contLifetime {
					t.Errorf("%s: active %d lifetime %d past the limits", w.ID, w.Active, w.Lifetime)
				}
				if w.Lifetime == contLifetime {
					drained++
					if w.Command != CommandShutdown {
						t.Errorf("%s reached the lifetime limit without a shutdown command", w.ID)
					}
				}
				lifetimes += w.Lifetime
			}
			if lifetimes != granted {
				t.Errorf("lifetimes add up to %d, grants to %d", lifetimes, granted)
			}
			if info.Leases != len(mine.Kept)+len(other.Kept) {
				t.Errorf("%d leases in Redis, %d held", info.Leases, len(mine.Kept)+len(other.Kept))
			}
			if mine.Drains+other.Drains != drained {
				t.Errorf("%d drain flags, %d workers at the limit", mine.Drains+other.Drains, drained)
			}
			// The test must reach both limits, or it proves nothing about them.
			if drained == 0 || mine.Refused+other.Refused == 0 || max(mine.MaxActive, other.MaxActive) != contConcurrent {
				t.Errorf("%d workers reached the lifetime limit, %d claims refused, highest active %d: the limits were never tested",
					drained, mine.Refused+other.Refused, max(mine.MaxActive, other.MaxActive))
			}
		})
	}
}

func splitLines(b []byte) [][]byte {
	var out [][]byte
	start := 0
	for i, c := range b {
		if c == '\n' {
			out = append(out, b[start:i])
			start = i + 1
		}
	}
	return append(out, b[start:])
}
