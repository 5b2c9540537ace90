package caddygrid_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// A session that reaches max_session is closed by a WebSocket close frame
// with the policy code and a reason naming max_session, which the client
// reads as its close status; its slot is free in Redis right after.
func TestASessionPastMaxSessionIsClosedWithAReason(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2\n\t\t\tmax_session 1s")})
	s := mustDial(t, c.url("/playwright/chromium"))
	id := g.sessionOf("chromium", s).ID
	start := time.Now()
	code, reason, _, err := s.closed(10 * time.Second)
	if err != nil {
		t.Fatalf("the session ended without a close frame: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("closed after %s, max_session is 1s", took)
	}
	if code != websocket.StatusPolicyViolation || !strings.Contains(reason, "max_session") {
		t.Errorf("close %d %q, want %d with a reason naming max_session", code, reason, websocket.StatusPolicyViolation)
	}
	testenv.Eventually(t, 5*time.Second, "the slot is free in Redis", func() bool {
		_, ok, _ := g.reg.GetSession(context.Background(), "chromium", id)
		return !ok && g.active("chromium") == 0
	})
}

// With idle_timeout 1s, a session with no traffic is closed by a close
// frame naming idle_timeout and its slot freed, while a session that
// echoes a message every 300 ms outlives the timeout by far.
func TestAnIdleSessionIsClosedAndABusyOneLives(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2\n\t\t\tidle_timeout 1s")})
	idle := mustDial(t, c.url("/playwright/chromium"))
	busy := mustDial(t, c.url("/playwright/chromium"))
	idleID := g.sessionOf("chromium", idle).ID

	busyErr := make(chan error, 1)
	go func() {
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			if err := busy.echo("busy"); err != nil {
				busyErr <- err
				return
			}
			time.Sleep(300 * time.Millisecond)
		}
		busyErr <- nil
	}()

	code, reason, took, err := idle.closed(10 * time.Second)
	if err != nil {
		t.Fatalf("the idle session ended without a close frame: %v", err)
	}
	if code != websocket.StatusPolicyViolation || !strings.Contains(reason, "idle") {
		t.Errorf("close %d %q, want %d with a reason naming idle_timeout", code, reason, websocket.StatusPolicyViolation)
	}
	if took < 500*time.Millisecond || took > 3*time.Second {
		t.Errorf("the idle session was closed after %s, idle_timeout is 1s", took)
	}
	testenv.Eventually(t, 5*time.Second, "the idle session's slot is free in Redis", func() bool {
		_, ok, _ := g.reg.GetSession(context.Background(), "chromium", idleID)
		return !ok
	})
	if err := <-busyErr; err != nil {
		t.Fatalf("the busy session broke: %v", err)
	}
	if err := busy.echo("after 3s"); err != nil {
		t.Errorf("the busy session did not outlive idle_timeout: %v", err)
	}
	busy.close()
}
