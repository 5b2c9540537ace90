package caddygrid

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// backends holds one backend per Redis URL and prefix, shared by every
// config that names them: it survives a reload (DESIGN.md: state that
// must outlive a config lives in a UsagePool).
var backends = caddy.NewUsagePool()

type backendKey struct{ url, prefix string }

// backend is this Caddy instance's connection to one grid: the Redis
// client and registry, the wait queues and their wake-ups, and the
// sessions this instance carries.
type backend struct {
	key      backendKey
	rdb      redis.UniversalClient
	reg      *registry.Registry
	redacted string
	// instance names this Caddy in session records.
	instance string
	logger   *zap.Logger
	sessions *sessionKeeper
	// kicks asks the reaper to look at a group now (a claim walked past
	// stale workers there).
	kicks chan string

	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once

	mu       sync.Mutex
	queues   map[string]*waitQueue
	versions map[string]cachedVersions
	pubsub   *redis.PubSub
	watched  map[string]bool
	reports  map[string]time.Time
}

func loadBackend(key backendKey, logger *zap.Logger) (*backend, error) {
	v, _, err := backends.LoadOrNew(key, func() (caddy.Destructor, error) {
		rdb, err := registry.NewClient(key.url)
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithCancel(context.Background())
		var rnd [3]byte
		_, _ = rand.Read(rnd[:])
		host, _ := os.Hostname()
		return &backend{
			key: key, rdb: rdb, reg: registry.New(rdb, registry.Options{Prefix: key.prefix}),
			redacted: registry.RedactURL(key.url), logger: logger.Named("backend"),
			instance: host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(rnd[:]),
			sessions: newSessionKeeper(), kicks: make(chan string, 64),
			ctx: ctx, cancel: cancel,
			queues: map[string]*waitQueue{}, versions: map[string]cachedVersions{},
			watched: map[string]bool{}, reports: map[string]time.Time{},
		}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("connecting to redis %s: %w", registry.RedactURL(key.url), err)
	}
	return v.(*backend), nil
}

// retain takes one more reference (a claim in flight holds one, so that a
// reload to another Redis does not close the client under it).
func (b *backend) retain() { _, _ = backends.LoadOrStore(b.key, b) }

func (b *backend) release() { _, _ = backends.Delete(b.key) }

// Destruct closes the client once no config and no claim uses it.
func (b *backend) Destruct() error {
	b.cancel()
	b.mu.Lock()
	if b.pubsub != nil {
		b.pubsub.Close()
	}
	b.mu.Unlock()
	return b.rdb.Close()
}

// start subscribes to the wake-up channels, once per backend.
func (b *backend) start() {
	b.once.Do(func() {
		b.mu.Lock()
		b.pubsub = b.rdb.Subscribe(b.ctx)
		ps := b.pubsub
		b.mu.Unlock()
		go b.wakeups(ps)
		go b.keepQueues()
	})
}

// watch subscribes to a pool's wake-up channel (once).
func (b *backend) watch(pool string) {
	b.mu.Lock()
	if b.watched[pool] || b.pubsub == nil {
		b.mu.Unlock()
		return
	}
	b.watched[pool] = true
	ps := b.pubsub
	b.mu.Unlock()
	if err := ps.Subscribe(b.ctx, b.reg.WakeupChannel(pool)); err != nil {
		metrics.redisErrors.WithLabelValues("subscribe").Inc()
		b.mu.Lock()
		delete(b.watched, pool)
		b.mu.Unlock()
	}
}

// wakeups wakes a pool's head waiter for every message: a slot freed or a
// worker came, on any instance. A subscription made anew (Redis came back)
// wakes every queue.
func (b *backend) wakeups(ps *redis.PubSub) {
	pools := map[string]string{}
	for m := range ps.ChannelWithSubscriptions() {
		switch m := m.(type) {
		case *redis.Message:
			pool, ok := pools[m.Channel]
			if !ok {
				b.mu.Lock()
				for p := range b.watched {
					pools[b.reg.WakeupChannel(p)] = p
				}
				b.mu.Unlock()
				pool = pools[m.Channel]
			}
			b.queue(pool).wakeHead()
		case *redis.Subscription:
			b.mu.Lock()
			for _, q := range b.queues {
				q.wakeHead()
			}
			b.mu.Unlock()
		}
	}
}

// keepEvery is how often an instance keeps its waiters in their pools'
// queues (registry.QueueKeepFor is the bound it must stay under), and
// readEvery how often it reads the queue of a pool it has no waiter in.
const keepEvery, readEvery = 250 * time.Millisecond, time.Second

// keepQueues keeps this instance's waiters in their pools' queues, and
// reads each queue's depth and oldest wait for the metrics and the
// waiters' places.
func (b *backend) keepQueues() {
	t := time.NewTicker(keepEvery)
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		b.mu.Lock()
		qs := maps.Clone(b.queues)
		b.mu.Unlock()
		// each pool's call on its own: a slow one does not make the
		// others' waiters miss their deadline
		var wg sync.WaitGroup
		for pool, q := range qs {
			ws, kept := q.kept()
			if len(ws) == 0 && n%int(readEvery/keepEvery) != 0 {
				continue
			}
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(b.ctx, keepEvery)
				st, err := b.reg.QueueKeep(ctx, pool, kept)
				cancel()
				if err != nil {
					metrics.redisErrors.WithLabelValues("queue").Inc()
					return
				}
				q.read(ws, st, time.Now())
				metrics.poolQueue.WithLabelValues(pool).Set(float64(st.Depth))
				metrics.poolQueueAge.WithLabelValues(pool).Set(st.OldestWait.Seconds())
			})
		}
		wg.Wait()
	}
}

// leaveQueue takes a waiter out of its pool's queue, in the background:
// should the call fail, the waiter leaves once no one keeps it.
func (b *backend) leaveQueue(pool, id string) {
	go func() {
		ctx, cancel := context.WithTimeout(b.ctx, claimCallTimeout)
		defer cancel()
		if err := b.reg.QueueLeave(ctx, pool, id); err != nil {
			metrics.redisErrors.WithLabelValues("queue").Inc()
		}
	}()
}

// queue is the wait queue of a pool (every version group of it).
func (b *backend) queue(pool string) *waitQueue {
	b.mu.Lock()
	defer b.mu.Unlock()
	q, ok := b.queues[pool]
	if !ok {
		q = &waitQueue{}
		b.queues[pool] = q
	}
	return q
}

// kick asks the reaper to look at group now.
func (b *backend) kick(group string) {
	select {
	case b.kicks <- group:
	default:
	}
}

// firstReport lets one report a minute through per kind and subject.
func (b *backend) firstReport(kind, subject string) bool {
	k := kind + "\x00" + subject
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if last, ok := b.reports[k]; ok && now.Sub(last) < time.Minute {
		return false
	}
	if len(b.reports) > 10000 {
		clear(b.reports)
	}
	b.reports[k] = now
	return true
}

// sessionKeeper is the sessions this instance carries now: for its
// metrics and views, and to end them with a reason when Caddy stops or a
// reload's stream_close_delay runs out.
type sessionKeeper struct {
	mu   sync.Mutex
	live map[string]liveSession
}

type liveSession struct {
	pool, group, worker string
	started             time.Time
	owner               *Transport
}

func newSessionKeeper() *sessionKeeper { return &sessionKeeper{live: map[string]liveSession{}} }

func (k *sessionKeeper) add(id string, s liveSession) {
	k.mu.Lock()
	k.live[id] = s
	k.mu.Unlock()
	metrics.activeSessions.WithLabelValues(s.pool).Inc()
}

func (k *sessionKeeper) remove(id string) {
	k.mu.Lock()
	s, ok := k.live[id]
	delete(k.live, id)
	k.mu.Unlock()
	if ok {
		metrics.activeSessions.WithLabelValues(s.pool).Dec()
	}
}

// count is the live sessions of pool.
func (k *sessionKeeper) count(pool string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, s := range k.live {
		if s.pool == pool {
			n++
		}
	}
	return n
}

// end asks the agents of the sessions pick selects to end them with a
// close frame giving reason, and waits up to a second for them to go.
func (k *sessionKeeper) end(b *backend, pick func(liveSession) bool, reason string) {
	k.mu.Lock()
	var ids []string
	var ss []liveSession
	for id, s := range k.live {
		if pick(s) {
			ids, ss = append(ids, id), append(ss, s)
		}
	}
	k.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	pipe := b.rdb.Pipeline()
	for i, id := range ids {
		pipe.Publish(ctx, b.reg.AgentChannel(ss[i].group, ss[i].worker), registry.EndCommand(id, 1001, reason))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		b.logger.Warn("could not ask the agents to end this instance's sessions; Caddy closes them itself", zap.Error(err))
		return
	}
	for ctx.Err() == nil {
		k.mu.Lock()
		left := 0
		for _, id := range ids {
			if _, ok := k.live[id]; ok {
				left++
			}
		}
		k.mu.Unlock()
		if left == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (k *sessionKeeper) endAll(b *backend, reason string) {
	k.end(b, func(liveSession) bool { return true }, reason)
}

// Interface guards.
var _ caddy.Destructor = (*backend)(nil)
