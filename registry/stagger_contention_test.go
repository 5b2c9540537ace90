package registry

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/redis/go-redis/v9"
)

// The figures of the StaggerDrains contention proof: 10 workers of 5 slots
// with a lifetime of 5 sessions (short, so the run is about restarts, one
// at a time, rather than about climbing to the first one), and 2 processes
// of 10 claimers each, claiming, holding and releasing until told to stop.
const (
	staggerContLifetime = 5
	staggerContLoopers  = 10
	// staggerContRestarts is how many restarts a run waits for.
	staggerContRestarts = 8
)

var staggerContLimits = selection.Limits{MaxConcurrent: contConcurrent, MaxLifetime: staggerContLifetime, StaggerDrains: true}

// loopReport is what one process's claimers saw.
type loopReport struct {
	Granted, Refused, Drains int
	Errors                   []string
	// Over lists claims past max_concurrent or max_lifetime.
	Over []string
}

// loopClaimers runs loopers goroutines that claim (with StaggerDrains),
// hold the session a moment and release it, until stop closes. A refused
// claim waits a moment and tries again, as a request in Caddy's queue does.
func loopClaimers(url, policy string, loopers int, seed uint64, stop <-chan struct{}) loopReport {
	rdb, err := NewClient(url)
	if err != nil {
		return loopReport{Errors: []string{err.Error()}}
	}
	defer rdb.Close()
	r := New(rdb, Options{})
	ctx := context.Background()
	var mu sync.Mutex
	var rep loopReport
	var wg sync.WaitGroup
	pause := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-stop:
			return false
		case <-t.C:
			return true
		}
	}
	for i := range loopers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := r.Claim(ctx, ClaimRequest{Pool: "busy", Policy: Policy(policy), Holder: fmt.Sprint("looper-", seed),
					Limits: staggerContLimits, Rand: rng})
				if errors.Is(err, ErrNoWorker) {
					mu.Lock()
					rep.Refused++
					mu.Unlock()
					if !pause(time.Duration(1+rng.IntN(4)) * time.Millisecond) {
						return
					}
					continue
				}
				mu.Lock()
				if err != nil {
					rep.Errors = append(rep.Errors, err.Error())
					mu.Unlock()
					return
				}
				rep.Granted++
				if c.Drain {
					rep.Drains++
				}
				if c.Worker.Active > contConcurrent || c.Worker.Lifetime > staggerContLifetime {
					rep.Over = append(rep.Over, fmt.Sprintf("%s active %d lifetime %d", c.Worker.ID, c.Worker.Active, c.Worker.Lifetime))
				}
				mu.Unlock()
				pause(time.Duration(rng.IntN(3000)) * time.Microsecond) // the session
				if err := r.Release(ctx, "busy", c.LeaseID); err != nil {
					mu.Lock()
					rep.Errors = append(rep.Errors, err.Error())
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return rep
}

// staggerContentionHelper is the second process of
// TestContentionStaggerDrains (TestMain runs it when re-executed with
// GRID_STAGGER_URL set); it claims until its standard input closes.
func staggerContentionHelper(url string) {
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	rep := loopClaimers(url, os.Getenv("GRID_STAGGER_POLICY"), staggerContLoopers, 2, stop)
	b, _ := json.Marshal(rep)
	fmt.Printf("REPORT %s\n", b)
}

// staggerHelper starts the second process; closing stop (its standard
// input) ends it, and its report lands in rep before done delivers.
func staggerHelper(t *testing.T, url string, policy Policy, rep *loopReport) (stop func(), done <-chan error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.count=1")
	cmd.Env = append(os.Environ(), "GRID_STAGGER_URL="+url, "GRID_STAGGER_POLICY="+string(policy))
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan error, 1)
	go func() {
		var line, all []byte
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			l := sc.Bytes()
			all = append(append(all, l...), '\n')
			if len(l) > 7 && string(l[:7]) == "REPORT " {
				line = slices.Clone(l[7:])
			}
		}
		err := cmd.Wait()
		switch {
		case err != nil:
			err = fmt.Errorf("helper: %v\n%s", err, all)
		case line == nil:
			err = fmt.Errorf("helper printed no report:\n%s", all)
		default:
			err = json.Unmarshal(line, rep)
		}
		ch <- err
	}()
	return func() { in.Close() }, ch
}

// staggerAgent plays a worker's agent: it heartbeats every tick, and on
// the shutdown command marks the worker draining, waits for its sessions to
// end, deregisters it and registers its replacement (same id, counters at
// zero).
func staggerAgent(ctx context.Context, r *Registry, pool, id string, tick time.Duration, restarts *atomic.Int64) error {
	reg := Registration{Pool: pool, ID: id, BrowserType: "chromium", Addr: "127.0.0.1:9", Path: "/playwright", TTL: time.Minute}
	t := time.NewTicker(tick)
	defer t.Stop()
	draining := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		var err error
		switch {
		case !draining:
			var hb HeartbeatReply
			if hb, err = r.Heartbeat(ctx, pool, id, reg.TTL); err == nil && hb.Command == CommandShutdown {
				err = r.SetDraining(ctx, pool, id)
				draining = err == nil
			}
		default:
			var w WorkerInfo
			if w, err = r.Worker(ctx, pool, id); err == nil && w.Active == 0 {
				if err = r.Deregister(ctx, pool, id); err == nil {
					err = r.Register(ctx, reg)
					draining = err != nil
					restarts.Add(1)
				}
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("agent of %s: %w", id, err)
		}
	}
}

// retiringSample is one atomic look at the pool (MULTI/EXEC).
type retiringSample struct {
	// Retiring lists the workers draining or at the lifetime limit.
	Retiring []string
	// HeldBack: some available worker is a session short of its limit
	// while another retires, so StaggerDrains is what keeps it from it.
	HeldBack bool
}

func sampleRetiring(ctx context.Context, r *Registry, pool string) (retiringSample, error) {
	var recs, lifes *redis.MapStringStringCmd
	_, err := r.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		recs = p.HGetAll(ctx, r.Key(pool, keyWorkers))
		lifes = p.HGetAll(ctx, r.Key(pool, keyLifetime))
		return nil
	})
	if err != nil {
		return retiringSample{}, err
	}
	var s retiringSample
	short := false
	for id, raw := range recs.Val() {
		var rec struct{ Status string }
		if err := json.Unmarshal([]byte(raw), &rec); err != nil {
			return s, fmt.Errorf("record of %s: %w", id, err)
		}
		life, err := strconv.Atoi(lifes.Val()[id])
		if err != nil {
			return s, fmt.Errorf("lifetime of %s: %w", id, err)
		}
		switch {
		case rec.Status == string(selection.Draining) || life >= staggerContLifetime:
			s.Retiring = append(s.Retiring, id)
		case life == staggerContLifetime-1:
			short = true
		}
	}
	s.HeldBack = short && len(s.Retiring) > 0
	return s, nil
}

// Two processes of concurrent claimers with StaggerDrains on 10 workers
// (max_concurrent 5, max_lifetime 5) whose agents restart them when told
// to, until 8 restarts have happened: sampled atomically inside Redis all
// along, the pool never has two workers retiring (draining or at the limit)
// at once, while last sessions were held back meanwhile. The run waits for
// the restarts rather than lasting a fixed time, so a slow machine makes
// it longer, not vacuous.
func TestContentionStaggerDrains(t *testing.T) {
	for _, policy := range []Policy{LifetimeFirst, Vnode, FairShare} {
		t.Run(string(policy), func(t *testing.T) {
			ctx := context.Background()
			r, _ := startRegistry(t, Options{})
			srvURL := redisURL(r)
			for i := range contWorkers {
				register(t, r, "busy", fmt.Sprintf("w%d", i), 0)
			}
			bg, stopBG := context.WithCancel(ctx)
			var wg sync.WaitGroup
			var restarts atomic.Int64
			agentErrs := make(chan error, contWorkers)
			for i := range contWorkers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := staggerAgent(bg, r, "busy", fmt.Sprintf("w%d", i), 2*time.Millisecond, &restarts); err != nil {
						agentErrs <- err
					}
				}()
			}
			var samples, heldBack int
			var worst retiringSample
			sampled := make(chan error, 1)
			go func() {
				// Back to back: one MULTI/EXEC round trip after another.
				for {
					if bg.Err() != nil {
						sampled <- nil
						return
					}
					s, err := sampleRetiring(bg, r, "busy")
					if err != nil {
						if bg.Err() != nil {
							err = nil
						}
						sampled <- err
						return
					}
					samples++
					if s.HeldBack {
						heldBack++
					}
					if len(s.Retiring) > len(worst.Retiring) {
						worst = s
					}
				}
			}()

			var other loopReport
			stopHelper, helperDone := staggerHelper(t, srvURL, policy, &other)
			stopMine := make(chan struct{})
			mineDone := make(chan loopReport, 1)
			go func() { mineDone <- loopClaimers(srvURL, string(policy), staggerContLoopers, 1, stopMine) }()

			// Poll with a deadline for the restarts the run is about.
			deadline := time.Now().Add(60 * time.Second)
			for restarts.Load() < staggerContRestarts && time.Now().Before(deadline) && len(agentErrs) == 0 {
				time.Sleep(20 * time.Millisecond)
			}
			close(stopMine)
			stopHelper()
			mine := <-mineDone
			helperErr := <-helperDone
			stopBG()
			wg.Wait()
			if err := <-sampled; err != nil {
				t.Fatalf("sampling the pool: %v", err)
			}
			if helperErr != nil {
				t.Fatal(helperErr)
			}
			close(agentErrs)
			for err := range agentErrs {
				t.Error(err)
			}
			drains := mine.Drains + other.Drains
			t.Logf("%s: granted %d + %d, refused %d + %d, drains %d, restarts %d; %d samples, %d with a last session held back, most retiring at once %d",
				policy, mine.Granted, other.Granted, mine.Refused, other.Refused, drains, restarts.Load(), samples, heldBack, len(worst.Retiring))
			for _, rep := range []loopReport{mine, other} {
				if len(rep.Errors) > 0 {
					t.Fatalf("claim errors: %v", rep.Errors[:min(5, len(rep.Errors))])
				}
				if len(rep.Over) > 0 {
					t.Fatalf("limits exceeded: %v", rep.Over)
				}
			}
			if len(worst.Retiring) > 1 {
				t.Fatalf("%v were retiring at once", worst.Retiring)
			}
			if restarts.Load() < staggerContRestarts {
				t.Fatalf("only %d restarts in a minute", restarts.Load())
			}
			// Both processes took part, and the rule had something to hold back.
			if mine.Granted == 0 || other.Granted == 0 || heldBack == 0 {
				t.Fatalf("granted %d + %d, %d samples with a last session held back: the rule was never tested",
					mine.Granted, other.Granted, heldBack)
			}
			// At rest the retiring set holds exactly the retiring workers.
			s, err := sampleRetiring(ctx, r, "busy")
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(s.Retiring)
			if got := retiringSet(t, r, "busy"); !slices.Equal(got, s.Retiring) {
				t.Fatalf("retiring set %v, records say %v", got, s.Retiring)
			}
		})
	}
}
