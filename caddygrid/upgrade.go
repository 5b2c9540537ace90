package caddygrid

import (
	"context"
	"errors"
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
	msg := "worker refused a client's upgrade; not blamed unless another worker accepts the same request"
	if blamed {
		msg = "worker answered an upgrade without switching protocols; marked suspect"
	}
	b.logger.Warn(msg, zap.String("pool", c.Pool), zap.String("worker_id", c.Worker.ID),
		zap.String("addr", c.Worker.Addr), zap.Int("status", status), zap.Bool("suspect", blamed))
}

// blameLate marks suspect the worker of claim c, already given back
// unblamed, that refused with status the upgrade another worker has now
// accepted (see session.passed). Its lease is gone, so it is marked by
// generation: a worker registered again since is left alone.
func (b *backend) blameLate(c *registry.Claim, status int) {
	ctx, cancel := context.WithTimeout(context.Background(), redisCallTimeout)
	err := b.reg.Suspect(ctx, c.Pool, c.Worker.ID, c.Gen, suspectFor)
	cancel()
	switch {
	case errors.Is(err, registry.ErrNotRegistered):
		return // gone meanwhile: nothing left to keep claims from
	case err != nil:
		// not retried: the next request it refuses gets it blamed again
		metrics.redisErrors.WithLabelValues("suspect").Inc()
		b.logger.Warn("could not mark a worker suspect", zap.String("pool", c.Pool),
			zap.String("worker_id", c.Worker.ID), zap.Error(err))
		return
	}
	if b.firstReport("upgrade_refused_late", c.Pool, c.Worker.ID+" "+strconv.Itoa(status)) {
		b.logger.Warn("worker answered an upgrade without switching protocols, and another accepted it after a wait; marked suspect",
			zap.String("pool", c.Pool), zap.String("worker_id", c.Worker.ID),
			zap.String("addr", c.Worker.Addr), zap.Int("status", status), zap.Bool("suspect", true))
	}
}
