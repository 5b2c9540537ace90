package caddygrid

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the grid's Prometheus metrics on Caddy's /metrics (the
// admin endpoint), kept across reloads. Every pool label is the pool
// itself, never a version group: the version is a label of its own where
// it matters. docs/configuration.md lists them (a test checks).
var metrics = struct {
	selections     *prometheus.CounterVec
	selectDuration *prometheus.HistogramVec
	queueWait      *prometheus.HistogramVec
	queueDepth     *prometheus.GaugeVec
	poolQueue      *prometheus.GaugeVec
	poolQueueAge   *prometheus.GaugeVec
	activeSessions *prometheus.GaugeVec
	rejections     *prometheus.CounterVec
	refusals       *prometheus.CounterVec
	dialFailures   *prometheus.CounterVec
	retirements    *prometheus.CounterVec
	redisErrors    *prometheus.CounterVec
	versions       *prometheus.CounterVec
	reaped         *prometheus.CounterVec
}{
	selections: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "caddy", Subsystem: "grid", Name: "selections_total",
		Help: "Workers claimed for a session (one atomic select-and-claim that found one)."}, []string{"pool", "policy"}),
	selectDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "caddy", Subsystem: "grid", Name: "select_duration_seconds",
		Help: "Time of one select-and-claim call to Redis.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14)}, []string{"pool", "policy"}),
	queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "caddy", Subsystem: "grid", Name: "queue_wait_seconds",
		Help: "Time a request waited for a free worker, whatever the outcome.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"pool"}),
	queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "caddy", Subsystem: "grid", Name: "queue_depth",
		Help: "Requests waiting for a free worker in this instance."}, []string{"pool"}),
	poolQueue: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "caddy", Subsystem: "grid", Name: "pool_queue_depth",
		Help: "Requests waiting for a free worker in the pool's queue, across every instance."}, []string{"pool"}),
	poolQueueAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "caddy", Subsystem: "grid", Name: "pool_queue_oldest_seconds",
		Help: "How long the oldest request in the pool's queue has waited."}, []string{"pool"}),
	activeSessions: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "caddy", Subsystem: "grid", Name: "active_sessions",
		Help: "Sessions this instance carries now."}, []string{"pool"}),
	rejections: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "caddy", Subsystem: "grid", Name: "rejections_total",
		Help: "Requests the grid answered itself instead of a browser: 400, 426, 428, 429, 502, 503."}, []string{"pool", "code"}),
	refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "caddy", Subsystem: "grid", Name: "agent_refusals_total",
		Help: "Claims an agent refused (full, spent, draining, held, gone): retried on another worker, no worker blamed."}, []string{"pool", "reason"}),
	dialFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "caddy", Subsystem: "grid", Name: "dial_failures_total",
		Help: "Claims whose worker could not be dialed or failed the upgrade: given back, the worker skipped for 5s, the session retried elsewhere."}, []string{"pool"}),
	retirements: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "caddy", Subsystem: "grid", Name: "retirements_total",
		Help: "Claims that brought a worker to max_lifetime: it retires."}, []string{"pool"}),
	redisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "caddy", Subsystem: "grid", Name: "redis_errors_total",
		Help: "Failed Redis calls, by operation: claim, give_back, versions, subscribe, reap, admin."}, []string{"op"}),
	versions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "caddy", Subsystem: "grid", Name: "version_sessions_total",
		Help: "Sessions claimed by the Playwright version of the serving worker (none: a worker without one), and 428s for a version no worker serves (unregistered)."}, []string{"pool", "version"}),
	reaped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "caddy", Subsystem: "grid", Name: "workers_reaped_total",
		Help: "Stale workers this instance's reaper removed."}, []string{"pool"}),
}

// registerMetrics registers the metrics once in Caddy's registry.
func registerMetrics(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{metrics.selections, metrics.selectDuration, metrics.queueWait, metrics.queueDepth, metrics.poolQueue, metrics.poolQueueAge,
		metrics.activeSessions, metrics.rejections, metrics.refusals, metrics.dialFailures, metrics.retirements,
		metrics.redisErrors, metrics.versions, metrics.reaped, badRecords} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}
