package caddygrid

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// waitQueue is one pool's bounded FIFO of requests waiting for a free
// worker in this Caddy instance. Each waiter also holds a place in the
// pool's queue in Redis (registry.QueueJoin), which orders the waiters
// of every instance: this one orders only the wake-ups.
//
// A freed slot wakes only the waiter at the head (not every waiter, which
// would send a burst of claims to Redis for one slot). A waiter that then
// claims a worker leaves and passes the wake-up on to the new head, so
// that when several slots free at once (a worker registers) the queue
// drains one claim after another; a waiter that finds nothing keeps its
// place and waits for the next wake-up.
type waitQueue struct {
	mu      sync.Mutex
	waiters []*waiter
	// served and at are the pool queue's count of requests served, as
	// last read, and when; rate its recent rate (per second); poolDepth
	// and oldest its depth and oldest wait as last read.
	served    int64
	at        time.Time
	rate      float64
	poolDepth int
	oldest    time.Duration
}

// waiter is one queued request. wake holds at most one pending wake-up.
type waiter struct {
	wake chan struct{}
	// id names it in the pool's queue; pos is its place there as last
	// read (0: first).
	id  string
	pos int
	// versions and avoid are what its claims may take (registry.Waiter).
	versions, avoid []string
	// client is the request's client key (client_limit; "" none).
	client string
	// key names what the waiter's claims can take: its version groups
	// and the workers it avoids. A waiter that found nothing passes its
	// wake-up to one that may take something else (wakeNext).
	key string
}

// setKey records what w's claims can take (see wakeNext).
func (q *waitQueue) setKey(w *waiter, groups, avoid []string) {
	key := strings.Join(groups, " ") + "|" + strings.Join(slices.Sorted(slices.Values(avoid)), " ")
	vs := make([]string, len(groups))
	for i, g := range groups {
		_, vs[i] = registry.SplitGroup(g)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	w.key, w.versions, w.avoid = key, vs, slices.Clone(avoid)
}

// kept lists the waiters for registry.QueueKeep.
func (q *waitQueue) kept() ([]*waiter, []registry.Waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var ws []*waiter
	var out []registry.Waiter
	for _, w := range q.waiters {
		if w.pos >= 0 { // joined the pool's queue
			ws = append(ws, w)
			out = append(out, w.registry())
		}
	}
	return ws, out
}

// read records what QueueKeep read: each waiter's place, and the pool's
// rate of sessions served from the queue.
func (q *waitQueue) read(ws []*waiter, st registry.QueueState, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.poolDepth, q.oldest = st.Depth, st.OldestWait
	for i, w := range ws {
		if i < len(st.Positions) {
			w.pos = st.Positions[i]
		}
	}
	if dt := now.Sub(q.at); !q.at.IsZero() && dt >= rateWindow {
		r := float64(st.Served-q.served) / dt.Seconds()
		if r < 0 {
			r = 0
		}
		q.rate = r
		q.served, q.at = st.Served, now
	} else if q.at.IsZero() {
		q.served, q.at = st.Served, now
	}
}

// retryAfter estimates when a request at place pos (0: first) would be
// served, from the rate the pool's queue is served at; ok false without
// one.
func (q *waitQueue) retryAfter(pos int) (time.Duration, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.rate <= 0 || pos < 0 {
		return 0, false
	}
	return time.Duration(float64(pos+1) / q.rate * float64(time.Second)), true
}

// poolState is the pool queue's depth and oldest wait as last read.
func (q *waitQueue) poolState() (int, time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.poolDepth, q.oldest
}

// registryWaiter is w as the pool's queue holds it.
func (q *waitQueue) registryWaiter(w *waiter) registry.Waiter {
	q.mu.Lock()
	defer q.mu.Unlock()
	return w.registry()
}

// registry is w as the pool's queue holds it (q.mu held).
func (w *waiter) registry() registry.Waiter {
	return registry.Waiter{ID: w.id, Versions: w.versions, Avoid: w.avoid}
}

func (q *waitQueue) setPosition(w *waiter, pos int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.pos = pos
}

// position is w's place in the pool's queue as last read.
func (q *waitQueue) position(w *waiter) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return w.pos
}

// rateWindow is how long the queue's rate is measured over.
const rateWindow = 10 * time.Second

// joinClient appends a waiter for a request of client (its client key;
// "" none) unless the queue already holds limit waiters, or client, which
// may have at most perClient waiters in the queue (0: no bound), has them:
// a client can be served no more sessions than its client_limit, so its
// further requests would only hold places other clients need. clientFull
// reports a refusal for that bound.
func (q *waitQueue) joinClient(limit int, client string, perClient int) (w *waiter, ok, clientFull bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waiters) >= limit {
		return nil, false, false
	}
	if client != "" && perClient > 0 {
		n := 0
		for _, x := range q.waiters {
			if x.client == client {
				n++
			}
		}
		if n >= perClient {
			return nil, false, true
		}
	}
	w = &waiter{wake: make(chan struct{}, 1), client: client, id: newSessionID(), pos: -1}
	q.waiters = append(q.waiters, w)
	return w, true, false
}

// leave removes w. When w held a wake-up it did not use, the wake-up goes
// to the next waiter, so no freed slot is left unclaimed.
func (q *waitQueue) leave(w *waiter) {
	q.mu.Lock()
	for i, x := range q.waiters {
		if x == w {
			q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
			break
		}
	}
	pending := false
	select {
	case <-w.wake:
		pending = true
	default:
	}
	q.mu.Unlock()
	if pending {
		q.wakeHead()
	}
}

// wakeHead gives the head waiter a wake-up (a no-op when it has one
// pending or the queue is empty).
func (q *waitQueue) wakeHead() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waiters) == 0 {
		return
	}
	select {
	case q.waiters[0].wake <- struct{}{}:
	default:
	}
}

// wakeNext passes on a wake-up w could not use: the slot freed may be in
// another version group, or on a worker w avoids, which waiters behind it
// can take. The wake-up goes to the first waiter behind w whose claims can
// take something else (another key): one with the same would find nothing
// too, so a line of them costs one claim more per freed slot, not one per
// waiter. A no-op when there is none, or w is not queued.
func (q *waitQueue) wakeNext(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := slices.Index(q.waiters, w)
	if i < 0 {
		return
	}
	for _, x := range q.waiters[i+1:] {
		if x.key != w.key {
			select {
			case x.wake <- struct{}{}:
			default:
			}
			return
		}
	}
}

// isHead reports whether w is first in line.
func (q *waitQueue) isHead(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiters) > 0 && q.waiters[0] == w
}

// depth is the number of waiters.
func (q *waitQueue) depth() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiters)
}
