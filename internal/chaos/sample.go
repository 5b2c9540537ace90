package chaos

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// The sampler reads, continuously and from outside, what the grid
// believes (every worker with its active count, and the session records,
// from Redis) and what is true (every browser's live sessions, its peak
// and its total since it started, from fakebrowser's /stats, found
// through its agent's /status). The figures of the table come from
// comparing the two.

// persistFor is how long a worker's Redis count must disagree with its
// browser's live sessions before the counts are called wrong: a claim is
// counted in Redis a moment before its browser sees the session (and an
// end a moment after), so a single sample between the two is no error. A
// real phantom or missing slot lasts until something heals it.
const persistFor = time.Second

// endpoint is one browser process (a fakebrowser server). A respawned
// worker is a new endpoint.
type endpoint struct {
	id    string // its worker ID
	addr  string // the browser's own address, behind its agent
	limit int
	// from the latest successful /stats read
	live, peak, sessions int64
	reachable            bool
	lastSeen             time.Time
	// counted is the total already judged for lifetime overshoots.
	counted int64
	// overAdmitted is the most sessions it held beyond its limit.
	overAdmitted int64
	// mismatchSince is when its Redis count started to disagree (zero:
	// it agrees).
	mismatchSince time.Time
}

// sample is the grid's state at one moment.
type sample struct {
	at      time.Time
	redisOK bool
	// bad: counts wrong (a disagreement older than persistFor, a browser
	// over its limit), Redis unreadable, or the scenario's own check
	// failed.
	bad bool
	// leak is the slots Redis holds beyond the live sessions.
	leak     int
	stale    int
	sessions int
	live     int
	// retiring counts the workers in the retiring set (stagger_drains);
	// free the slots the available workers have left.
	retiring int
	free     int
}

type sampler struct {
	reg      *registry.Registry
	interval time.Duration
	// concurrency is the most sessions a browser may hold (the largest
	// max_concurrent any instance applies; a worker's own capacity, when
	// lower, wins).
	concurrency int
	// lifetimeAt is the max_lifetime in force at a moment (0: none).
	lifetimeAt func(time.Time) int
	// extraBad is the scenario's own check of a sample (nil: none).
	extraBad func(registry.GroupInfo) bool
	http     *http.Client

	mu         sync.Mutex
	eps        map[string]*endpoint // by worker ID
	samples    []sample
	overshoots int64
	logf       func(string, ...any)
	prevAt     time.Time
	stop       chan struct{}
	done       chan struct{}
}

func newSampler(reg *registry.Registry, interval time.Duration, concurrency int, lifetimeAt func(time.Time) int) *sampler {
	return &sampler{
		reg: reg, interval: interval, concurrency: concurrency, lifetimeAt: lifetimeAt,
		http: &http.Client{Timeout: 300 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}},
		eps:  map[string]*endpoint{}, stop: make(chan struct{}), done: make(chan struct{}),
	}
}

func (s *sampler) start() {
	go func() {
		defer close(s.done)
		t := time.NewTicker(s.interval)
		defer t.Stop()
		for {
			s.once()
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
}

func (s *sampler) close() {
	close(s.stop)
	<-s.done
}

type stats struct {
	Sessions   int64 `json:"sessions"`
	Active     int64 `json:"active"`
	PeakActive int64 `json:"peak_active"`
}

// getJSON reads a JSON answer of one of the grid's processes.
func (s *sampler) getJSON(url string, v any) error {
	resp, err := s.http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

func (s *sampler) once() {
	now := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), max(800*time.Millisecond, 2*s.interval))
	info, err := s.reg.Inspect(ctx, Pool)
	sessions := 0
	if err == nil {
		var n int64
		n, err = s.reg.Client().HLen(ctx, s.reg.Key(Pool, "sessions")).Result()
		sessions = int(n)
	}
	cancel()
	smp := sample{at: now, redisOK: err == nil, sessions: sessions}
	active := map[string]int{}
	agents := map[string]bool{}
	if err == nil {
		smp.retiring = len(info.Retiring)
		for _, w := range info.Workers {
			if now.Sub(w.LastHeartbeat) > staleThreshold {
				smp.stale++
			}
			if w.Status == "available" {
				limit := s.concurrency
				if w.Record.Capacity > 0 && w.Record.Capacity < limit {
					limit = w.Record.Capacity
				}
				smp.free += max(0, limit-w.Active)
			}
			active[w.ID] += w.Active
			// Only the scenario's own agents (IDs worker-N-…) have a
			// browser behind them; records the scenario wrote itself (a
			// lost zone) have none.
			if strings.HasPrefix(w.ID, "worker-") {
				agents[w.Addr] = true
			}
		}
		if s.extraBad != nil && s.extraBad(info) {
			smp.bad = true
		}
	} else {
		smp.bad = true
		// The harness's own Cluster client learns a failover the plain
		// go-redis way: reload the slot map after a failed read, as the
		// grid's client does, so that the observer does not lag the grid.
		if cc, ok := s.reg.Client().(*redis.ClusterClient); ok {
			cc.ReloadState(context.Background())
		}
	}
	// The agents say which browser is behind each worker.
	s.mu.Lock()
	for _, ep := range s.eps {
		if now.Sub(ep.lastSeen) < 5*time.Second {
			agents[ep.agent()] = true
		}
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	var amu sync.Mutex
	found := map[string]string{} // worker ID -> browser address
	for addr := range agents {
		if addr == "" {
			continue
		}
		wg.Go(func() {
			var st struct {
				Browsers []struct {
					ID      string `json:"id"`
					Backend string `json:"backend"`
				} `json:"browsers"`
			}
			if s.getJSON("http://"+addr+"/status", &st) != nil {
				return
			}
			amu.Lock()
			for _, b := range st.Browsers {
				found[b.ID] = addr + " " + b.Backend
			}
			amu.Unlock()
		})
	}
	wg.Wait()
	s.mu.Lock()
	for id, where := range found {
		if _, ok := s.eps[id]; ok {
			continue
		}
		limit := s.concurrency
		for _, w := range info.Workers {
			if w.ID == id && w.Record.Capacity > 0 && w.Record.Capacity < limit {
				limit = w.Record.Capacity
			}
		}
		s.eps[id] = &endpoint{id: id, addr: where, limit: limit, lastSeen: now}
	}
	eps := make([]*endpoint, 0, len(s.eps))
	for _, ep := range s.eps {
		if now.Sub(ep.lastSeen) < 5*time.Second {
			eps = append(eps, ep)
		}
	}
	s.mu.Unlock()

	got := make([]*stats, len(eps))
	for i, ep := range eps {
		wg.Go(func() {
			var st stats
			if s.getJSON("http://"+ep.browser()+"/stats", &st) == nil {
				got[i] = &st
			}
		})
	}
	wg.Wait()

	s.mu.Lock()
	defer s.mu.Unlock()
	// Sessions counted now began since the previous read: judge them by
	// the limit in force when that interval started.
	lifetime, from := 0, s.prevAt
	if from.IsZero() {
		from = now
	}
	s.prevAt = now
	if s.lifetimeAt != nil {
		lifetime = s.lifetimeAt(from)
	}
	sumExcess := 0
	for i, ep := range eps {
		st := got[i]
		ep.reachable = st != nil
		if st == nil {
			ep.live = 0
		} else {
			ep.lastSeen = now
			ep.live, ep.peak, ep.sessions = st.Active, st.PeakActive, st.Sessions
			if over := ep.peak - int64(ep.limit); over > ep.overAdmitted {
				ep.overAdmitted = over
			}
			// Sessions begun since the last read that took the browser
			// past the max_lifetime now in force.
			if lifetime > 0 {
				floor := max(ep.counted, int64(lifetime))
				if ep.sessions > floor {
					s.overshoots += ep.sessions - floor
					if s.logf != nil {
						s.logf("overshoot: browser %s at %d sessions, max_lifetime %d, %d before", ep.id, ep.sessions, lifetime, ep.counted)
					}
				}
			}
			ep.counted = max(ep.counted, ep.sessions)
		}
		smp.live += int(ep.live)
		if ep.live > int64(ep.limit) {
			smp.bad = true
		}
		if !smp.redisOK {
			continue
		}
		diff := active[ep.id] - int(ep.live)
		if diff > 0 {
			sumExcess += diff
		}
		if diff != 0 {
			if ep.mismatchSince.IsZero() {
				ep.mismatchSince = now
			}
			if now.Sub(ep.mismatchSince) >= persistFor {
				smp.bad = true
			}
		} else {
			ep.mismatchSince = time.Time{}
		}
	}
	if smp.redisOK {
		// Workers whose browser is not read (dead, or never reachable)
		// hold no live session: all their active count is excess.
		for id, a := range active {
			if ep, ok := s.eps[id]; (!ok || now.Sub(ep.lastSeen) >= 5*time.Second) && a > 0 {
				sumExcess += a
			}
		}
		smp.leak = max(sumExcess, smp.sessions-smp.live)
	}
	s.samples = append(s.samples, smp)
}

// agent is the address of the endpoint's agent; browser its browser's.
func (ep *endpoint) agent() string {
	a, _, _ := strings.Cut(ep.addr, " ")
	return a
}

func (ep *endpoint) browser() string {
	_, b, _ := strings.Cut(ep.addr, " ")
	return b
}

// latest returns the last sample (zero when none yet).
func (s *sampler) latest() sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.samples) == 0 {
		return sample{}
	}
	return s.samples[len(s.samples)-1]
}

// all returns every sample so far.
func (s *sampler) all() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sample(nil), s.samples...)
}

// overAdmissions is the sum over browsers of the most sessions each held
// beyond its limit at once.
func (s *sampler) overAdmissions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := int64(0)
	for _, ep := range s.eps {
		n += ep.overAdmitted
	}
	return int(n)
}

// lifetimeOvershoots is how many sessions began on a browser already at
// the max_lifetime in force.
func (s *sampler) lifetimeOvershoots() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(s.overshoots)
}

// liveOn returns the live sessions of worker id's browser (as last read).
func (s *sampler) liveOn(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ep, ok := s.eps[id]; ok {
		return int(ep.live)
	}
	return 0
}

// browserActive reads the sessions worker id's browser holds now, from
// the browser itself; false when it cannot be read.
func (s *sampler) browserActive(id string) (int, bool) {
	addr := s.browserOf(id)
	if addr == "" {
		return 0, false
	}
	var st stats
	if s.getJSON("http://"+addr+"/stats", &st) != nil {
		return 0, false
	}
	return int(st.Active), true
}

// browserOf returns the address of worker id's browser ("" unknown).
func (s *sampler) browserOf(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ep, ok := s.eps[id]; ok {
		return ep.browser()
	}
	return ""
}
