package main

// The fairness section: whether the requests waiting for a pool are
// served oldest first across Caddy instances. Two bin/caddy instances
// share one Redis and two agents (fake launcher) with max_concurrent 2:
// a pool of 4 slots. Sessions hold their slot 50 ms; arrivals are Poisson
// at 1.2× the pool's capacity, 4 of every 5 through instance A and 1
// through B, so a queue builds. select_timeout and queue_size are raised
// so that every request waits to the end. The run is made twice, fresh
// each time: with the pool's shared queue (the default) and with
// shared_queue off, where each instance queues its own, the baseline.
// Fair is when A's and B's clients wait alike: p50 and p90 within
// 0.8-1.25× of each other.
//
//	gridbench -only fairness          # about a minute
//	gridbench -only fairness -quick   # a smoke run

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"
)

func init() {
	register(section{name: "fairness", order: 65, run: runFairness})
}

const (
	fairSlots = 4
	fairHold  = 50 * time.Millisecond
	fairLoad  = 1.2
)

// fairRun is one run's waits, by instance.
type fairRun struct {
	waits  [2][]time.Duration
	failed int
	first  string
}

func runFairness(cfg *config) error {
	out := cfg.out
	perB := 500 // waits through the quieter instance
	if cfg.quick {
		perB = 40
	}
	runs := []struct {
		name   string
		shared bool
	}{{"shared queue (default)", true}, {"shared_queue off (per instance)", false}}
	res := make([]fairRun, len(runs))
	for i, r := range runs {
		var err error
		if res[i], err = fairnessRun(r.shared, perB); err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
	}
	rate := fairLoad * fairSlots / fairHold.Seconds()
	fmt.Fprintf(out, "Two bin/caddy, two agents (fake launcher), max_concurrent 2: %d slots; %d ms sessions; Poisson arrivals at %.0f/s\n", fairSlots, fairHold.Milliseconds(), rate)
	fmt.Fprintf(out, "(%.1f× capacity), 4:1 between instance A and B, until B has seen %d; a wait is from dial to 101.\n\n", fairLoad, perB)
	ms := func(d time.Duration) string { return f(float64(d.Microseconds())/1e3, 1) }
	ratio := func(r fairRun, q float64) float64 {
		a, b := quantile(r.waits[0], q), quantile(r.waits[1], q)
		if a == 0 {
			return 0
		}
		return float64(b) / float64(a)
	}
	head := []string{"figure"}
	for _, r := range runs {
		head = append(head, r.name)
	}
	row := func(what string, v func(r fairRun) string) []string {
		cells := []string{what}
		for _, r := range res {
			cells = append(cells, v(r))
		}
		return cells
	}
	table(out, head,
		row("waits through A / B", func(r fairRun) string { return fmt.Sprintf("%d / %d", len(r.waits[0]), len(r.waits[1])) }),
		row("A wait p50 / p90 (ms)", func(r fairRun) string {
			return ms(quantile(r.waits[0], 0.5)) + " / " + ms(quantile(r.waits[0], 0.9))
		}),
		row("B wait p50 / p90 (ms)", func(r fairRun) string {
			return ms(quantile(r.waits[1], 0.5)) + " / " + ms(quantile(r.waits[1], 0.9))
		}),
		row("B ÷ A at p50", func(r fairRun) string { return f(ratio(r, 0.5), 2) + "×" }),
		row("B ÷ A at p90", func(r fairRun) string { return f(ratio(r, 0.9), 2) + "×" }),
		row("failures", func(r fairRun) string { return strconv.Itoa(r.failed) }),
	)
	for i, r := range res {
		if r.first != "" {
			fmt.Fprintf(out, "(%s, first failure: %s)\n", runs[i].name, r.first)
		}
	}
	in := func(x float64) bool { return x >= 0.8 && x <= 1.25 }
	var gs []goal
	for i, r := range res {
		p50, p90 := ratio(r, 0.5), ratio(r, 0.9)
		want := "0.8-1.25×: both instances' clients wait alike"
		met := in(p50) && in(p90)
		if !runs[i].shared {
			want = "outside 0.8-1.25×: the baseline shows what unfair looks like"
			met = !met
		}
		gs = append(gs, goal{"B ÷ A wait, p50 and p90, " + runs[i].name, f(p50, 2) + "× / " + f(p90, 2) + "×", "A's clients", "—", want, met})
	}
	goals(out, gs...)
	return nil
}

// fairnessRun makes one run in a world of its own.
func fairnessRun(shared bool, perB int) (fairRun, error) {
	var res fairRun
	w, err := newWorld()
	if err != nil {
		return res, err
	}
	defer w.close()
	if err := w.startAgents(2, benchPool); err != nil {
		return res, err
	}
	block := "\t\tmax_concurrent 2\n\t\tselect_timeout 10m\n\t\tqueue_size 100000\n"
	if !shared {
		block += "\t\tshared_queue off\n"
	}
	routes, err := w.gridInstances(2, block)
	if err != nil {
		return res, err
	}
	rate := fairLoad * fairSlots / fairHold.Seconds()
	var mu sync.Mutex
	var wg sync.WaitGroup
	rnd := rand.New(rand.NewPCG(1, 2))
	for sentB := 0; sentB < perB; {
		time.Sleep(time.Duration(rnd.ExpFloat64() / rate * float64(time.Second)))
		i := 0
		if rnd.IntN(5) == 0 {
			i = 1
			sentB++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			// a queue that builds for the whole run: waits pass 10 s
			conn, _, err := routes[i].dialWithin(2 * time.Minute)
			wait := time.Since(t)
			mu.Lock()
			if err != nil {
				res.failed++
				if res.first == "" {
					res.first = err.Error()
				}
			} else {
				res.waits[i] = append(res.waits[i], wait)
			}
			mu.Unlock()
			if err == nil {
				time.Sleep(fairHold)
				_ = conn.Close(1000, "")
			}
		}()
	}
	wg.Wait()
	return res, nil
}
