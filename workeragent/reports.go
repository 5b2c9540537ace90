package workeragent

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// reports are the agent's writes to Redis, made by one goroutine in the
// order they happened: ends of served sessions, claims given back, and
// heartbeats, each snapshot taken after the ends before it were sent. Ends
// that queue while a call is in flight go together in the next one. A
// failed call drops what it carried: the next heartbeat reports the
// sessions still live, and Redis ends the rest.
type reports struct {
	a    *Agent
	kick chan struct{}

	mu      sync.Mutex
	ends    map[*worker][]registry.Ended
	gives   map[giveKey][]string
	beating bool
	// flushing serializes flushes (the loop's and remove's).
	flushing sync.Mutex
}

type giveKey struct{ group, worker string }

func newReports(a *Agent) *reports {
	return &reports{a: a, kick: make(chan struct{}, 1), ends: map[*worker][]registry.Ended{}, gives: map[giveKey][]string{}}
}

func (rp *reports) poke() {
	select {
	case rp.kick <- struct{}{}:
	default:
	}
}

// ended queues a served session's end.
func (rp *reports) ended(wk *worker, e registry.Ended) {
	rp.mu.Lock()
	rp.ends[wk] = append(rp.ends[wk], e)
	rp.mu.Unlock()
	rp.poke()
}

// giveBack queues a claim the agent refused, and a heartbeat to follow
// it: the refusal says Redis' counts were off.
func (rp *reports) giveBack(wk *worker, group string, t registry.Ticket) {
	if wk == nil {
		// A claim for a browser this agent does not run: not this
		// agent's to give back (Caddy does; a replayed claim must end
		// nobody's session). A record left at this agent's address by a
		// browser gone from it goes, with its sessions.
		go rp.a.forgetStale(t.Group, t.Worker)
		return
	}
	rp.mu.Lock()
	k := giveKey{group, t.Worker}
	rp.gives[k] = append(rp.gives[k], t.Session)
	rp.beating = true
	rp.mu.Unlock()
	rp.poke()
}

// beat asks for a heartbeat now.
func (rp *reports) beat() {
	rp.mu.Lock()
	rp.beating = true
	rp.mu.Unlock()
	rp.poke()
}

func (rp *reports) run(ctx context.Context) {
	tick := time.NewTicker(rp.a.cfg.HeartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			rp.mu.Lock()
			rp.beating = true
			rp.mu.Unlock()
		case <-rp.kick:
		}
		rp.flush()
	}
}

// flush sends what is queued.
func (rp *reports) flush() {
	rp.flushing.Lock()
	defer rp.flushing.Unlock()
	rp.mu.Lock()
	ends, gives, beat := rp.ends, rp.gives, rp.beating
	rp.ends, rp.gives, rp.beating = map[*worker][]registry.Ended{}, map[giveKey][]string{}, false
	rp.mu.Unlock()
	a := rp.a
	failed := false
	for wk, es := range ends {
		ctx, cancel := context.WithTimeout(context.Background(), redisCallTimeout)
		_, err := a.reg.EndServed(ctx, wk.rec.Group(), wk.rec.ID, es)
		cancel()
		failed = failed || rp.failed("ending sessions", err)
	}
	for k, ss := range gives {
		ctx, cancel := context.WithTimeout(context.Background(), redisCallTimeout)
		_, err := a.reg.GiveBack(ctx, k.group, k.worker, false, 0, ss...)
		cancel()
		failed = failed || rp.failed("giving back refused claims", err)
	}
	if beat {
		failed = !rp.heartbeatAll() || failed
	}
	if failed {
		// Redis is away: a heartbeat once it answers again sets it right.
		time.AfterFunc(time.Second, rp.beat)
	}
}

// heartbeatAll reports every worker's state; it reports false when
// Redis could not be reached.
func (rp *reports) heartbeatAll() bool {
	a := rp.a
	ok := true
	for _, wk := range a.workers() {
		st := wk.state(a.held(wk))
		ctx, cancel := context.WithTimeout(context.Background(), redisCallTimeout)
		rep, err := a.reg.Heartbeat(ctx, wk.rec.Group(), wk.rec.ID, st)
		if errors.Is(err, registry.ErrNotRegistered) {
			// Redis lost the record (a restart, a failover, the reaper
			// during a partition): register again with the truth.
			err = a.reg.Register(ctx, wk.rec, st, "")
			if err == nil {
				a.log.Warn("the record was gone; registered again with the browser's sessions", zap.String("worker_id", wk.rec.ID),
					zap.Int("sessions", len(st.Sessions)), zap.Int("lifetime", st.Lifetime))
			}
		}
		cancel()
		if rp.failed("heartbeat", err) {
			ok = false
			continue
		}
		a.metrics.heartbeats.Inc()
		if rep.Drain {
			a.retiring(wk, "an operator asked it to drain")
		}
		if len(rep.End) > 0 {
			end := map[string]bool{}
			for _, id := range rep.End {
				end[id] = true
			}
			wk.endSessions(func(s *session) bool { return end[s.id] }, CloseNormal, "operator", "ended by the operator")
		}
	}
	return ok
}

// failed logs err (at most once every ten seconds) and reports whether
// there was one.
func (rp *reports) failed(what string, err error) bool {
	if err == nil {
		return false
	}
	rp.a.metrics.redisErrors.Inc()
	if rp.a.logLimit.allow() {
		rp.a.log.Warn("redis call failed; retrying", zap.String("call", what), zap.Error(err))
	}
	return true
}

// forgetStale removes the record of a worker ID a claim named at this
// agent's address that no browser of this agent serves (one left by a
// previous agent process here): claims stop trying it.
func (a *Agent) forgetStale(group, id string) {
	if registry.CheckPool(group) != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), redisCallTimeout)
	defer cancel()
	raw, err := a.rdb.HGet(ctx, a.reg.Key(group, "workers"), id).Result()
	if err != nil {
		return
	}
	rec, err := registry.DecodeRecord(id, raw)
	if err != nil || rec.Addr != a.Addr() {
		return
	}
	if err := a.reg.Deregister(ctx, group, id); err == nil {
		a.log.Info("removed the record of a browser no longer here", zap.String("worker_id", id))
	}
}

// subscribe hears the workers' commands (an operator's drain, a session to
// end). A subscription made anew (the connection came back: Redis may
// have restarted) sends a heartbeat at once, so the counts are restored
// without waiting for the next one.
func (a *Agent) subscribe(ctx context.Context) {
	ps := a.rdb.Subscribe(ctx)
	defer ps.Close()
	msgs := ps.ChannelWithSubscriptions(redis.WithChannelHealthCheckInterval(a.cfg.HeartbeatInterval))
	subscribed := map[string]bool{}
	sync := func() {
		want := map[string]bool{}
		for _, wk := range a.workers() {
			want[a.reg.AgentChannel(wk.rec.Group(), wk.rec.ID)] = true
		}
		var add, drop []string
		for c := range want {
			if !subscribed[c] {
				add = append(add, c)
			}
		}
		for c := range subscribed {
			if !want[c] {
				drop = append(drop, c)
			}
		}
		if len(add) > 0 {
			if err := ps.Subscribe(ctx, add...); err != nil && ctx.Err() == nil {
				a.log.Warn("subscribing to the command channel", zap.Error(err))
				time.AfterFunc(time.Second, a.signalChans)
				return
			}
		}
		if len(drop) > 0 {
			_ = ps.Unsubscribe(ctx, drop...)
		}
		subscribed = want
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.chans:
			sync()
		case m, ok := <-msgs:
			if !ok {
				return
			}
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind == "subscribe" {
					a.reports.beat()
					go a.forgetDeparted()
				}
			case *redis.Message:
				a.command(m.Channel, m.Payload)
			}
		}
	}
}

// command acts on one message of a worker's channel.
func (a *Agent) command(channel, msg string) {
	for _, wk := range a.workers() {
		if a.reg.AgentChannel(wk.rec.Group(), wk.rec.ID) != channel {
			continue
		}
		switch cmd, sid, code, reason := registry.ParseCommand(msg); cmd {
		case registry.CommandDrain:
			a.retiring(wk, "an operator asked it to drain")
		case "end":
			why := "operator"
			if code == CloseGoingAway {
				why = "caddy"
			}
			wk.endSessions(func(s *session) bool { return s.id == sid }, code, why, reason)
		}
	}
}

func (a *Agent) signalChans() {
	select {
	case a.chans <- struct{}{}:
	default:
	}
}
