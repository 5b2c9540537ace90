package caddygrid

import (
	"net/http"
	"strconv"

	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// upgradeRefused counts and logs an upgrade attempt the worker answered
// with another status than 101 (0: no answer, nothing to report). The log
// line comes at most once a minute per worker and status: a client that
// sends bad handshakes on purpose must not flood the log.
func (b *backend) upgradeRefused(c *registry.Claim, status int, blamed bool) {
	if status == 0 || status == http.StatusSwitchingProtocols {
		return
	}
	code := strconv.Itoa(status)
	metrics.upgradeRefused.WithLabelValues(c.Pool, code).Inc()
	if !b.firstReport("upgrade_refused", c.Pool, c.Worker.ID+" "+code) {
		return
	}
	msg := "worker refused a client's upgrade; the client's doing, no worker blamed"
	if blamed {
		msg = "worker answered an upgrade without switching protocols; marked suspect"
	}
	b.logger.Warn(msg, zap.String("pool", c.Pool), zap.String("worker_id", c.Worker.ID),
		zap.String("addr", c.Worker.Addr), zap.Int("status", status), zap.Bool("suspect", blamed))
}
