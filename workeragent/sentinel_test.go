package workeragent_test

import (
	"context"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// The agent takes the same redis+sentinel:// URL as Caddy: it registers
// through the sentinels' master, and its heartbeats reach the replica the
// sentinels promote when that master dies.
func TestAgentThroughSentinel(t *testing.T) {
	t.Parallel()
	s := testenv.StartSentinel(t, 1)
	rdb, err := registry.NewClient(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	reg := registry.New(rdb, registry.Options{})
	all := append([]string{"-redis", s.URL(), "-launcher", "fake"}, fastTimings...)
	p := testenv.Start(t, nil, gridWorker(), all...)
	w := waitOne(t, reg, "chromium", "", 20*time.Second)
	// The record lives on the master, and on its replica once in sync.
	info := s.Servers[0].Client().Exists(context.Background(), "{grid:chromium}:workers").Val()
	if info != 1 {
		t.Fatalf("the worker's pool is not on the sentinels' master %s", s.Servers[0].Addr)
	}
	s.WaitInSync(10 * time.Second)

	s.Servers[0].Kill()
	promoted := s.WaitFailover(s.Servers[0], 60*time.Second)
	after := time.Now()
	testenv.Eventually(t, 15*time.Second, "a heartbeat on the promoted master "+promoted.Addr, func() bool {
		got, ok := registered(t, reg, "chromium", w.ID)
		return ok && got.LastHeartbeat.After(after)
	})
	if lines := countLogs(p, "heartbeat failed; still serving, will retry"); lines > 0 {
		t.Logf("%d failed heartbeats during the failover", lines)
	}
}
