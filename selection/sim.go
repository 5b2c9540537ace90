package selection

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Selector is a policy that decides over a plain snapshot. LifetimeFirst,
// FairShare, *WeightedRoundRobin, *RoundRobin and *VnodeSelector are
// Selectors.
type Selector interface {
	Select(ws []Worker, now time.Time) Decision
}

// Dist draws a duration from r. Fixed, Uniform and Exponential make them.
type Dist func(r Rand) time.Duration

// Fixed always gives d.
func Fixed(d time.Duration) Dist { return func(Rand) time.Duration { return d } }

// Uniform gives a whole number of milliseconds uniform in [lo, hi].
func Uniform(lo, hi time.Duration) Dist {
	a, b := lo.Milliseconds(), hi.Milliseconds()
	if b < a {
		a, b = b, a
	}
	return func(r Rand) time.Duration {
		return time.Duration(a+int64(r.IntN(int(b-a+1)))) * time.Millisecond
	}
}

// Exponential gives exponentially distributed durations with the given
// mean (a Poisson process when used for inter-arrival times), rounded to
// milliseconds.
func Exponential(mean time.Duration) Dist {
	return func(r Rand) time.Duration {
		u := (float64(r.Uint64()>>11) + 0.5) / (1 << 53) // in (0, 1)
		return time.Duration(math.Round(-math.Log(u)*float64(mean.Milliseconds()))) * time.Millisecond
	}
}

// SimConfig describes a simulated pool.
type SimConfig struct {
	// Workers is N, the pool's size.
	Workers int
	// Limits apply to every decision; MaxLifetime drives the restarts.
	Limits Limits
	// Capacity is what every worker reports (0: none).
	Capacity int
	// Interarrival is the time between session requests.
	Interarrival Dist
	// Duration is how long each session lasts.
	Duration Dist
	// RestartDelay is the time from a drained worker's last session ending
	// to its coming back available with a lifetime of 0 (the browser's
	// restart and re-registration).
	RestartDelay time.Duration
	// Warmup is left out of the figures, so they describe the steady
	// state rather than the start where every worker is at 0.
	Warmup time.Duration
	// Length is the simulated time measured after Warmup.
	Length time.Duration
	// Policy decides; Rand draws arrivals and durations (and a
	// VnodeSelector's own Rand may be the same one).
	Policy Selector
	Rand   Rand
	// Start is the simulated clock's origin. Default: Unix 0.
	Start time.Time
	// Trace, when > 0, records a Sample every Trace of simulated time.
	Trace time.Duration
}

// SimSample is the pool at one instant of a trace.
type SimSample struct {
	At time.Duration
	// Lifetimes and Down per worker (Down: draining or restarting).
	Lifetimes []int
	Down      []bool
}

// SimResult is what a simulation measured after its warmup.
type SimResult struct {
	// Arrivals counts session requests; Served those a worker took;
	// Rejected those that found no eligible worker (a grid would queue
	// them, which this simulation does not model).
	Arrivals, Served, Rejected int
	// Restarts counts workers that reached the lifetime limit.
	Restarts int
	// MaxDown is the most workers draining or restarting at the same
	// instant (a draining worker finishes its sessions but takes no new
	// ones).
	MaxDown int
	// MinCapacity is the lowest fraction of workers accepting sessions
	// (available), at any instant: 1 - MaxDown/N.
	MinCapacity float64
	// MeanCapacity is that fraction averaged over time.
	MeanCapacity float64
	// DownTime[k] is the time spent with exactly k workers down.
	DownTime []time.Duration
	// Trace is filled when SimConfig.Trace > 0.
	Trace []SimSample
}

// worker states beyond Worker.Status.
const (
	simServing = iota
	simDraining
	simRestarting
)

type simEvent struct {
	at   int64 // ms since start
	seq  int
	kind int
	w    int
	dur  int64 // session length (ends), for fair share's history
}

const (
	evArrival = iota
	evEnd
	evBack
)

type simQueue []simEvent

func (q simQueue) Len() int { return len(q) }
func (q simQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q simQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *simQueue) Push(x any)   { *q = append(*q, x.(simEvent)) }
func (q *simQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// Simulate runs a discrete-event simulation of a pool: sessions arrive,
// the policy picks a worker (active +1, lifetime +1), sessions end
// (active -1). A claim that brings a worker to MaxLifetime makes it drain:
// it takes no new sessions, and once its last session ends it restarts,
// coming back available with counters at 0 after RestartDelay. Workers
// always heartbeat (fresh) and are never suspect. Fair share's predicted
// end and duration history are maintained as the registry would.
//
// The same config and Rand state give the same result.
func Simulate(cfg SimConfig) (SimResult, error) {
	switch {
	case cfg.Workers < 1:
		return SimResult{}, fmt.Errorf("simulating %d workers: need at least 1", cfg.Workers)
	case cfg.Policy == nil || cfg.Rand == nil:
		return SimResult{}, errors.New("simulation needs a Policy and a Rand")
	case cfg.Interarrival == nil || cfg.Duration == nil:
		return SimResult{}, errors.New("simulation needs Interarrival and Duration")
	case cfg.Length <= 0:
		return SimResult{}, fmt.Errorf("simulation length %s: must be more than 0", cfg.Length)
	}
	start := cfg.Start
	if start.IsZero() {
		start = time.UnixMilli(0)
	}
	fs, isFairShare := cfg.Policy.(FairShare)
	window := fs.Window
	if window <= 0 {
		window = DefaultWindow
	}
	n := cfg.Workers
	ws := make([]Worker, n)
	state := make([]int, n)
	width := len(strconv.Itoa(n - 1))
	for i := range ws {
		ws[i] = Worker{ID: fmt.Sprintf("w%0*d", width, i), Status: Available, Capacity: cfg.Capacity, LastHeartbeat: start}
	}
	warm, end := cfg.Warmup.Milliseconds(), (cfg.Warmup + cfg.Length).Milliseconds()
	res := SimResult{DownTime: make([]time.Duration, n+1)}
	down := 0
	var q simQueue
	seq := 0
	push := func(e simEvent) {
		e.seq = seq
		seq++
		heap.Push(&q, e)
	}
	push(simEvent{at: cfg.Interarrival(cfg.Rand).Milliseconds(), kind: evArrival})

	last := int64(0) // ms up to which DownTime is accounted
	account := func(t int64) {
		from := max(last, warm)
		if t > from {
			res.DownTime[down] += time.Duration(t-from) * time.Millisecond
		}
		last = t
	}
	nextTrace := warm
	trace := func(t int64) {
		if cfg.Trace <= 0 {
			return
		}
		for nextTrace <= t && nextTrace < end {
			s := SimSample{At: time.Duration(nextTrace-warm) * time.Millisecond, Lifetimes: make([]int, n), Down: make([]bool, n)}
			for i := range ws {
				s.Lifetimes[i], s.Down[i] = ws[i].Lifetime, state[i] != simServing
			}
			res.Trace = append(res.Trace, s)
			nextTrace += cfg.Trace.Milliseconds()
		}
	}
	// observe records the number of workers down at an instant t.
	observe := func(t int64) {
		if t >= warm && down > res.MaxDown {
			res.MaxDown = down
		}
	}

	for q.Len() > 0 {
		e := heap.Pop(&q).(simEvent)
		if e.at > end {
			break
		}
		trace(e.at - 1)
		account(e.at)
		observe(e.at) // the state since the previous event
		now := start.Add(time.Duration(e.at) * time.Millisecond)
		measured := e.at >= warm
		switch e.kind {
		case evArrival:
			push(simEvent{at: e.at + max(cfg.Interarrival(cfg.Rand).Milliseconds(), 1), kind: evArrival})
			for i := range ws {
				ws[i].LastHeartbeat = now
			}
			d := cfg.Policy.Select(ws, now)
			if measured {
				res.Arrivals++
			}
			if !d.OK || d.Index < 0 {
				if measured {
					res.Rejected++
				}
				continue
			}
			w := &ws[d.Index]
			if measured {
				res.Served++
			}
			if isFairShare {
				w.PredictedEnd = fs.Claimed(w, now)
			}
			w.Active++
			w.Lifetime++
			dur := max(cfg.Duration(cfg.Rand).Milliseconds(), 1)
			push(simEvent{at: e.at + dur, kind: evEnd, w: d.Index, dur: dur})
			if cfg.Limits.MaxLifetime > 0 && w.Lifetime >= cfg.Limits.MaxLifetime {
				w.Status = Draining
				state[d.Index] = simDraining
				down++
				if measured {
					res.Restarts++
				}
			}
		case evEnd:
			w := &ws[e.w]
			w.Active--
			w.Durations = append(w.Durations, time.Duration(e.dur)*time.Millisecond)
			if len(w.Durations) > window {
				w.Durations = w.Durations[len(w.Durations)-window:]
			}
			if state[e.w] == simDraining && w.Active == 0 {
				state[e.w] = simRestarting
				push(simEvent{at: e.at + cfg.RestartDelay.Milliseconds(), kind: evBack, w: e.w})
			}
		case evBack:
			ws[e.w] = Worker{ID: ws[e.w].ID, Status: Available, Capacity: cfg.Capacity, LastHeartbeat: now}
			state[e.w] = simServing
			down--
		}
		observe(e.at)
	}
	trace(end)
	account(end)
	var up float64
	for k, t := range res.DownTime {
		up += float64(n-k) / float64(n) * t.Seconds()
	}
	res.MeanCapacity = up / cfg.Length.Seconds()
	res.MinCapacity = float64(n-res.MaxDown) / float64(n)
	return res, nil
}

// RandomFleet is n available, fresh workers of a busy pool under l, with
// every figure drawn from r: active below the cap, lifetime below the
// limit, up to 20 recent session durations of 5-60 s and predicted ends up
// to a minute ahead. Benchmarks and cmd/gridbench decide over it.
func RandomFleet(n int, l Limits, r Rand, now time.Time) []Worker {
	width := len(strconv.Itoa(max(n-1, 0)))
	ws := make([]Worker, n)
	for i := range ws {
		w := Worker{
			ID:            fmt.Sprintf("worker-%0*d", width, i),
			Status:        Available,
			LastHeartbeat: now.Add(-time.Duration(r.IntN(5000)) * time.Millisecond),
			PredictedEnd:  now.Add(time.Duration(r.IntN(60000)) * time.Millisecond),
		}
		if c := l.Cap(&w); c > 0 {
			w.Active = r.IntN(c)
		} else {
			w.Active = r.IntN(4)
		}
		if l.MaxLifetime > 0 {
			w.Lifetime = r.IntN(l.MaxLifetime)
		} else {
			w.Lifetime = r.IntN(100)
		}
		for range r.IntN(21) {
			w.Durations = append(w.Durations, time.Duration(5000+r.IntN(55001))*time.Millisecond)
		}
		ws[i] = w
	}
	return ws
}

// Interface guards.
var _ heap.Interface = (*simQueue)(nil)
