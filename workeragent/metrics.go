package workeragent

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// agentMetrics are the agent's /metrics (docs/operations.md lists them).
type agentMetrics struct {
	reg         *prometheus.Registry
	sessions    prometheus.Counter
	live        prometheus.Gauge
	browsers    prometheus.Gauge
	refusals    *prometheus.CounterVec
	ends        *prometheus.CounterVec
	bytes       *prometheus.CounterVec
	heartbeats  prometheus.Counter
	redisErrors prometheus.Counter
}

func newAgentMetrics() *agentMetrics {
	m := &agentMetrics{
		reg: prometheus.NewRegistry(),
		sessions: prometheus.NewCounter(prometheus.CounterOpts{Name: "grid_worker_sessions_total",
			Help: "Sessions the agent relayed to a browser (the browser accepted the upgrade)."}),
		live: prometheus.NewGauge(prometheus.GaugeOpts{Name: "grid_worker_live_sessions",
			Help: "Sessions being relayed now."}),
		browsers: prometheus.NewGauge(prometheus.GaugeOpts{Name: "grid_worker_browsers",
			Help: "Browsers the agent runs: 1, or 2 while a replacement serves and the old one drains."}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grid_worker_refusals_total",
			Help: "Claims the agent refused, by reason: full, spent, draining, held, gone, bad_claim."}, []string{"reason"}),
		ends: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grid_worker_session_ends_total",
			Help: "Sessions ended, by what ended them: closed (a side closed), max_session, idle_timeout, operator, caddy, drain_timeout, shutdown, crash."}, []string{"reason"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "grid_worker_relay_bytes_total",
			Help: "Bytes relayed, by direction: to_client, to_browser (counted when a session ends)."}, []string{"direction"}),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{Name: "grid_worker_heartbeats_total",
			Help: "Heartbeats Redis took."}),
		redisErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "grid_worker_redis_errors_total",
			Help: "Calls to Redis that failed."}),
	}
	m.reg.MustRegister(m.sessions, m.live, m.browsers, m.refusals, m.ends, m.bytes, m.heartbeats, m.redisErrors)
	return m
}

// rateLimit lets one event through per period.
type rateLimit struct {
	mu     sync.Mutex
	next   time.Time
	period time.Duration
}

func (l *rateLimit) allow() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if now.Before(l.next) {
		return false
	}
	l.next = now.Add(l.period)
	return true
}
