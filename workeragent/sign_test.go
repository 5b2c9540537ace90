package workeragent_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// TestSignsItsRecordWithTheSecret: with GRID_WORKER_SECRET set, the
// agent's record carries a signature that verifies with that secret (and
// not another), still does after heartbeats, and the secret appears in
// none of the agent's output. Without it the record is unsigned.
func TestSignsItsRecordWithTheSecret(t *testing.T) {
	t.Parallel()
	const secret = "agent-test-secret-7f3a"
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	args := append([]string{"-redis", r.URL(), "-launcher", "fake", "-pool", "signed", "-log-level", "debug"}, fastTimings...)
	p := testenv.Start(t, []string{"GRID_WORKER_SECRET=" + secret}, gridWorker(), args...)
	w := waitOne(t, reg, "signed", "", 15*time.Second)
	if err := w.CheckSignature([]byte(secret)); err != nil {
		t.Fatalf("the agent's record does not verify with its secret: %v", err)
	}
	if err := w.CheckSignature([]byte("another")); !errors.Is(err, registry.ErrBadSignature) {
		t.Errorf("the record verifies with another secret: %v", err)
	}
	heartbeatsWhile(t, reg, "signed", w.ID, 2, func(w registry.WorkerInfo) bool {
		return w.CheckSignature([]byte(secret)) == nil
	})
	if strings.Contains(p.Output(), secret) {
		t.Error("the agent's output holds the secret")
	}

	startWorker(t, r, "-pool", "plain")
	plain := waitOne(t, reg, "plain", "", 15*time.Second)
	if err := plain.CheckSignature([]byte(secret)); !errors.Is(err, registry.ErrUnsigned) {
		t.Errorf("a record registered without a secret: %v, want ErrUnsigned", err)
	}
}
