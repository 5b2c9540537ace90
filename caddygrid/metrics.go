package caddygrid

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// The grid's metrics live in package variables, as Caddy's own reverse
// proxy metrics do: a config reload creates a new Prometheus registry, and
// the same collectors are registered in it, so counters keep counting
// across reloads. Every name starts with caddy_grid_. Labels are bounded:
// pool names are the configured ones (never a raw client value), policy is
// one of the policy names (registry.PolicyNames), code and reason are
// fixed sets.
var metrics = struct {
	selections     *prometheus.CounterVec
	noWorker       *prometheus.CounterVec
	selectDuration *prometheus.HistogramVec
	queueWait      *prometheus.HistogramVec
	queueDepth     *prometheus.GaugeVec
	activeSessions *prometheus.GaugeVec
	rejections     *prometheus.CounterVec
	dialRetries    *prometheus.CounterVec
	releases       *prometheus.CounterVec
	drains         *prometheus.CounterVec
	redisErrors    *prometheus.CounterVec
	leasesLost     *prometheus.CounterVec
	staleSeen      *prometheus.CounterVec
	scanDepth      *prometheus.HistogramVec
	wraps          *prometheus.CounterVec
	samples        *prometheus.HistogramVec
	dedupes        *prometheus.CounterVec
	tiedMin        *prometheus.CounterVec

	// leasesReasserted and claimsCancelled: see lease renewal and
	// cancelClaim in backend.go.
	leasesReasserted *prometheus.CounterVec
	claimsCancelled  *prometheus.CounterVec

	// clientLimited: see clientlimit.go; upgradeRefused: upgrade.go.
	clientLimited  *prometheus.CounterVec
	upgradeRefused *prometheus.CounterVec

	// batchCalls: registry.Options.OnBatch (backend.go).
	batchCalls *prometheus.HistogramVec
}{
	batchCalls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "redis_batch_calls",
		Help:    "Claims (script claim) or lease ends (script lease) one call to Redis carried: 1 when it went alone, more when a busy pool's calls waited for one in flight and went together.",
		Buckets: []float64{1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256},
	}, []string{"pool", "script"}),
	upgradeRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "upgrade_refused_total",
		Help: "Upgrade attempts a worker answered with another status than 101, by status (5xx, 404 and 1xx-3xx count as the worker's failure; other 4xx as the client's, unless another worker accepted the same request).",
	}, []string{"pool", "code"}),
	clientLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "client_limited_total",
		Help: "Requests refused (429; 503 in a hand-composed reverse_proxy) because their client held its client_limit of live sessions in the pool.",
	}, []string{"pool"}),
	selections: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "selections_total",
		Help: "Sessions claimed on a worker (one atomic select-and-claim that found a worker).",
	}, []string{"pool", "policy"}),
	noWorker: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "no_worker_total",
		Help: "Select-and-claim calls that found no eligible worker.",
	}, []string{"pool", "policy"}),
	selectDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "select_duration_seconds",
		Help:    "Time of one select-and-claim call to Redis.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
	}, []string{"pool", "policy"}),
	queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "queue_wait_seconds",
		Help:    "Time requests spent in the queue waiting for a free worker, whatever the outcome.",
		Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"pool"}),
	queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "queue_depth",
		Help: "Requests waiting in this instance's queue for a free worker.",
	}, []string{"pool"}),
	activeSessions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "active_sessions",
		Help: "Sessions this instance holds a claim for (claimed and not yet released).",
	}, []string{"pool"}),
	rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "rejections_total",
		Help: "Requests the grid answered itself: 400 unknown pool or an upgrade with a body, 426 not a WebSocket, 428 a Playwright version no worker of the pool serves, 429 queue full or client limit, 503 no worker in time, Redis unreachable or a replaced config. pool is empty for 400 and 426.",
	}, []string{"pool", "code"}),
	dialRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "dial_retries_total",
		Help: "Claims given back because the worker could not be dialed or refused the upgrade, and tried again on another worker.",
	}, []string{"pool"}),
	releases: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "releases_total",
		Help: "Claims ended: outcome released (session served, lifetime kept) or undone (given back, lifetime too).",
	}, []string{"pool", "outcome"}),
	drains: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "drains_total",
		Help: "Claims that brought a worker to max_lifetime and so set its shutdown command.",
	}, []string{"pool"}),
	redisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "redis_errors_total",
		Help: "Redis calls that failed, by operation.",
	}, []string{"op"}),
	leasesLost: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "leases_lost_total",
		Help: "Leases of live sessions that a renewal found ended by someone else (released or cancelled); they are no longer renewed. A session that finished while the renewal was on its way is not counted.",
	}, []string{"pool"}),
	leasesReasserted: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "leases_reasserted_total",
		Help: "Leases of live sessions that were missing from Redis (expired while it was unreachable, or lost by a restart or failover) and that a renewal wrote again, re-asserting their workers' counts.",
	}, []string{"pool"}),
	claimsCancelled: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "claims_cancelled_total",
		Help: "Claims whose call failed (timeout, lost connection) that were cancelled afterwards, so they leave no lease and no count.",
	}, []string{"pool"}),
	staleSeen: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "stale_workers_seen_total",
		Help: "Workers with a heartbeat older than stale_threshold that a decision walked past (each is queued for expiry).",
	}, []string{"pool"}),
	scanDepth: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "scan_depth",
		Help:    "Index or ring entries a decision examined (summed over samples for vnode).",
		Buckets: []float64{1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256},
	}, []string{"pool", "policy"}),
	wraps: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "vnode_wraps_total",
		Help: "vnode ring walks that wrapped past the end of the ring.",
	}, []string{"pool"}),
	samples: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "vnode_samples_effective",
		Help:    "Unique candidates per vnode decision (samples >= 2 only).",
		Buckets: []float64{1, 2, 3, 4, 5, 6, 7, 8},
	}, []string{"pool"}),
	dedupes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "vnode_sample_dedupes_total",
		Help: "vnode samples that resolved to an already chosen worker (samples >= 2 only).",
	}, []string{"pool"}),
	tiedMin: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "grid", Name: "vnode_tied_min_total",
		Help: "vnode decisions where two or more candidates tied at the minimum and the random tiebreak decided (samples >= 2 only).",
	}, []string{"pool"}),
}

// gridCollectors are every metric of the grid (docs/configuration.md's
// metrics table lists each: TestDocsListEveryMetric).
func gridCollectors() []prometheus.Collector {
	return []prometheus.Collector{
		metrics.selections, metrics.noWorker, metrics.selectDuration, metrics.queueWait,
		metrics.queueDepth, metrics.activeSessions, metrics.rejections, metrics.dialRetries,
		metrics.releases, metrics.drains, metrics.redisErrors, metrics.leasesLost,
		metrics.leasesReasserted, metrics.claimsCancelled, metrics.clientLimited, metrics.upgradeRefused,
		metrics.staleSeen, metrics.scanDepth, metrics.wraps, metrics.samples,
		metrics.dedupes, metrics.tiedMin, metrics.batchCalls, reaperEvents, badRecords, versionSessions,
	}
}

// registerMetrics adds the grid's collectors to a config's registry.
// Registering the same collector twice (several grid apps or reloads into
// the same registry) is not an error.
func registerMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	for _, c := range gridCollectors() {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}

// observeBatch records how many calls one call to Redis carried
// (registry.Options.OnBatch).
func observeBatch(pool, script string, calls int) {
	metrics.batchCalls.WithLabelValues(pool, script).Observe(float64(calls))
}

// observeDecision records the scan figures of one decision. vnode's
// sample figures are only meaningful (and only recorded) at samples >= 2,
// as the vnode design (Rivet pegboard) specifies.
func observeDecision(pool string, policy string, samples int, d selection.Decision) {
	metrics.scanDepth.WithLabelValues(pool, policy).Observe(float64(d.Scanned))
	if len(d.Stale) > 0 {
		metrics.staleSeen.WithLabelValues(pool).Add(float64(len(d.Stale)))
	}
	if policy != policyVnode {
		return
	}
	if d.Wraps > 0 {
		metrics.wraps.WithLabelValues(pool).Add(float64(d.Wraps))
	}
	if samples >= 2 {
		metrics.samples.WithLabelValues(pool).Observe(float64(d.Effective))
		if d.Dedupes > 0 {
			metrics.dedupes.WithLabelValues(pool).Add(float64(d.Dedupes))
		}
		if d.TiedMin {
			metrics.tiedMin.WithLabelValues(pool).Inc()
		}
	}
}
