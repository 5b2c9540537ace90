package workeragent

import (
	"sync"
	"time"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// worker is one browser process and its record: what the agent knows for
// certain about it. Its mutex makes admitting a session one atomic step,
// so no two connections take the same last slot.
type worker struct {
	rec     registry.Record
	proc    *Browser
	backend string // the browser's private host:port

	mu       sync.Mutex
	live     map[string]*session
	lifetime int
	status   registry.Status
	// retiring is set when the worker took its last session, was told to
	// drain, or the agent stops: it takes no session from then on.
	retiring bool
	// drained is closed once it is retiring and holds no session.
	drained     chan struct{}
	drainedOnce sync.Once
	// removed is closed when the agent closes the browser itself: its exit
	// then is no crash.
	removed     chan struct{}
	removedOnce sync.Once
}

// session is one live session of a worker.
type session struct {
	id      string
	ticket  registry.Ticket
	started time.Time
	relay   *relay // nil until the browser accepted
}

func newWorker(rec registry.Record, proc *Browser, backend string) *worker {
	return &worker{rec: rec, proc: proc, backend: backend, live: map[string]*session{},
		status: registry.Serving, drained: make(chan struct{}), removed: make(chan struct{})}
}

// admission is what admit decided.
type admission struct {
	refused string // a registry.Refused* reason, "" when admitted
	last    bool   // the session is the worker's last: it retires now
	active  int
	served  int
}

// admit takes a session for the ticket unless that would break the limits
// it carries or the worker's own: the agent's last word. held: the agent
// still runs the browser this one replaced, so this one may not take its
// last session.
func (w *worker) admit(t registry.Ticket, held bool) admission {
	w.mu.Lock()
	defer w.mu.Unlock()
	a := admission{active: len(w.live), served: w.lifetime}
	limit := effectiveCap(w.rec.Capacity, t.Limits.MaxConcurrent)
	ml := t.Limits.MaxLifetime
	switch {
	case w.retiring || w.status != registry.Serving:
		a.refused = registry.RefusedDraining
	case limit > 0 && len(w.live) >= limit:
		a.refused = registry.RefusedFull
	case ml > 0 && w.lifetime >= ml:
		a.refused = registry.RefusedSpent
	case ml > 0 && w.lifetime+1 >= ml && held:
		a.refused = registry.RefusedHeld
	}
	if a.refused != "" {
		return a
	}
	w.live[t.Session] = &session{id: t.Session, ticket: t, started: time.Now()}
	w.lifetime++
	if ml > 0 && w.lifetime >= ml {
		w.retiring = true
		a.last = true
	}
	a.active, a.served = len(w.live), w.lifetime
	return a
}

// unadmit undoes an admission the browser refused: the session was never
// served.
func (w *worker) unadmit(id string, last bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.live, id)
	w.lifetime--
	if last {
		w.retiring = false
	}
	w.checkDrained()
}

// started marks a session live with its relay.
func (w *worker) started(id string, r *relay) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.live[id]; s != nil {
		s.relay = r
	}
}

// ended removes a session that ended.
func (w *worker) ended(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.live, id)
	w.checkDrained()
}

// retire stops the worker taking sessions, with the status to report.
func (w *worker) retire(st registry.Status) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.retiring = true
	if w.status == registry.Serving || st == registry.Replaced {
		w.status = st
	}
	w.checkDrained()
}

func (w *worker) checkDrained() {
	if w.retiring && len(w.live) == 0 {
		w.drainedOnce.Do(func() { close(w.drained) })
	}
}

// isRetiring reports whether the worker takes no more sessions.
func (w *worker) isRetiring() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.retiring
}

// state is the worker's truth, as a heartbeat reports it.
func (w *worker) state(hold bool) registry.AgentState {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := registry.AgentState{Status: w.status, Lifetime: w.lifetime, Hold: hold}
	if w.retiring && st.Status == registry.Serving {
		st.Status = registry.Draining
	}
	for id, s := range w.live {
		ls := registry.LiveSession{ID: id, Client: s.ticket.Client}
		if s.relay != nil {
			ls.Idle = s.relay.idle()
		}
		st.Sessions = append(st.Sessions, ls)
	}
	return st
}

// endSessions ends the live sessions the filter picks with a close frame
// of code and reason (why names the cause for metrics), and reports how
// many it ended.
func (w *worker) endSessions(pick func(*session) bool, code int, why, reason string) int {
	w.mu.Lock()
	var rs []*relay
	for _, s := range w.live {
		if s.relay != nil && pick(s) {
			rs = append(rs, s.relay)
		}
	}
	w.mu.Unlock()
	for _, r := range rs {
		r.end(code, why, reason)
	}
	return len(rs)
}

// counts returns the live sessions and the lifetime.
func (w *worker) counts() (int, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.live), w.lifetime
}

// effectiveCap is the smaller of the worker's capacity and the claim's
// max_concurrent, ignoring either when 0 (0: no cap).
func effectiveCap(capacity, mc int) int {
	switch {
	case capacity > 0 && mc > 0:
		return min(capacity, mc)
	case capacity > 0:
		return capacity
	}
	return mc
}
