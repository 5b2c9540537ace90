package workeragent_test

// Record losses where Redis lost the leases too (found by red teams of
// 88a9024 and f1d1765): the agent's drain must wait for the proxies to
// re-assert them, and not where no session can be live.

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// sessionKeptAcrossTheLoss re-asserts c's lease reassertAt after the loss
// (as the holding Caddy would at its next renewal) and checks for 3 s more
// that the agent keeps draining and the session stays open.
func sessionKeptAcrossTheLoss(t *testing.T, r *testenv.Redis, p *testenv.Process, conn *websocket.Conn, c *registry.Claim, id string, lost time.Time, reassertAt time.Duration) {
	t.Helper()
	reg := newRegistry(t, r)
	time.Sleep(time.Until(lost.Add(reassertAt)))
	select {
	case <-p.Done():
		e, _ := lastLog(p, "drained", id)
		t.Fatalf("grid-worker exited %.1fs after the loss, before the holder re-asserted its live lease (at %s): its 'drained' log: %v",
			time.Since(lost).Seconds(), reassertAt, e)
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, rerr := reg.RenewLeases(ctx, "chromium", []registry.LeaseRenewal{{
		ID: c.LeaseID, Worker: c.Worker.ID, Gen: c.Gen, Lifetime: c.Worker.Lifetime,
	}}, time.Minute)
	cancel()
	end := time.Now().Add(3 * time.Second)
	for time.Now().Before(end) {
		select {
		case <-p.Done():
			e, _ := lastLog(p, "drained", id)
			t.Fatalf("grid-worker exited %.1fs after the loss with the session live (re-asserted at %s, err %v); 'drained' log: %v",
				time.Since(lost).Seconds(), reassertAt, rerr, e)
		default:
		}
		ectx, ecancel := context.WithTimeout(context.Background(), 2*time.Second)
		werr := conn.Write(ectx, websocket.MessageText, []byte("ping"))
		var msg []byte
		if werr == nil {
			_, msg, werr = conn.Read(ectx)
		}
		ecancel()
		if werr != nil || string(msg) != "ping" {
			t.Fatalf("the live session was cut %.1fs after the loss: %v", time.Since(lost).Seconds(), werr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Redis with RDB persistence crashes and restarts from its last snapshot
// (or Sentinel promotes a replica that lagged): the pool's config hash,
// and so its epoch, predates the loss, but the lease of a session claimed
// after the snapshot is gone. The agent finds its record 'expired' with
// the same dataset epoch, registers again and, SIGTERMed, must not read 0
// active as drained before the holder re-asserts the lease (f1d1765's
// epoch test took this for a record reaped with its leases intact, and
// cut the session).
func TestDrainAfterARestoreFromAnOlderSnapshotKeepsTheLiveSession(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	p := startWorker(t, r, "-drain-timeout", "20s")
	w := waitOne(t, reg, "chromium", "", 15*time.Second)
	_, ep, _ := browserOf(t, p, w.ID)
	release(t, reg, claim(t, reg, "chromium")) // the pool's epoch exists
	time.Sleep(600 * time.Millisecond)         // heartbeats carry it to the agent
	rdb := r.Client()
	if err := rdb.Save(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	epochBefore := rdb.HGet(context.Background(), reg.Key("chromium", "config"), "epoch").Val()

	conn, _, err := websocket.Dial(context.Background(), ep.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	c := claim(t, reg, "chromium")      // after the snapshot
	time.Sleep(3500 * time.Millisecond) // the snapshot's record is now past its key TTL (3s)

	lost := time.Now()
	r.Restart() // loads dump.rdb: epoch kept, the lease of c gone
	after := r.Client().HGet(context.Background(), reg.Key("chromium", "config"), "epoch").Val()
	t.Logf("epoch before %q, after the restart %q", epochBefore, after)
	if after == "" || after != epochBefore {
		t.Fatalf("the snapshot did not keep the epoch: the scenario is not set up")
	}
	time.Sleep(400 * time.Millisecond) // the agent re-registers (same generation, 0 active)
	p.Cmd.Process.Signal(syscall.SIGTERM)
	sessionKeptAcrossTheLoss(t, r, p, conn, c, w.ID, lost, time.Second)
	release(t, newRegistry(t, r), c)
}

// A browser's first heartbeat interval: sessions are claimed on it, Redis
// restarts empty, and a Caddy claims in the pool (writing a fresh epoch)
// before the agent's first heartbeat. The live session must be kept (an
// agent going by the epoch saw one where it had none, took it for the
// pool's first claims, and cut the session).
func TestDrainAfterAnEmptyRestartBeforeTheFirstHeartbeatKeepsTheLiveSession(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	// The pool has an epoch from long ago (no worker yet: NoWorker, but the
	// epoch is written).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, cerr := reg.Claim(ctx, registry.ClaimRequest{Pool: "chromium", Policy: registry.LifetimeFirst, Holder: "other", LeaseTTL: time.Minute})
	cancel()
	t.Logf("pre-claim: %v", cerr)
	p := startWorker(t, r, "-heartbeat-interval", "3s", "-key-ttl", "9s", "-stale-threshold", "9s", "-command-ttl", "10s", "-drain-timeout", "20s")
	w := waitOne(t, reg, "chromium", "", 15*time.Second)
	_, ep, _ := browserOf(t, p, w.ID)
	conn, _, err := websocket.Dial(context.Background(), ep.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	c := claim(t, reg, "chromium")
	lost := time.Now()
	r.Restart()
	// Another Caddy claims (its epoch mismatch, or a fresh one: the new
	// epoch is written either way).
	reg2 := newRegistry(t, r)
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	_, cerr = reg2.Claim(ctx, registry.ClaimRequest{Pool: "chromium", Policy: registry.LifetimeFirst, Holder: "other", LeaseTTL: time.Minute, Epoch: c.Epoch})
	cancel()
	var ee *registry.EpochError
	t.Logf("claim after the restart: %v (epoch error: %v); %.1fs after the worker's registration window began", cerr, errors.As(cerr, &ee), time.Since(lost).Seconds())
	p.Cmd.Process.Signal(syscall.SIGTERM)
	sessionKeptAcrossTheLoss(t, r, p, conn, c, w.ID, lost, time.Second)
	release(t, reg2, c)
}

// No needless wait: an idle worker in a pool never claimed, whose record
// the reaper removed (Redis kept everything), is SIGTERMed: it must stop
// at once, not after -lease-ttl, since no session can be live (an agent
// going by the epoch took "no epoch" for a loss and waited).
func TestIdleDrainAfterAReapedRecordOfANeverClaimedPoolIsNotHeld(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	p := startWorker(t, r, "-lease-ttl", "8s", "-drain-timeout", "20s")
	w := waitOne(t, reg, "chromium", "", 15*time.Second)
	if _, err := reg.Expire(context.Background(), "chromium", w.ID, 0); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "registered again", func() bool {
		_, ok := registered(t, reg, "chromium", w.ID)
		return ok
	})
	start := time.Now()
	p.Cmd.Process.Signal(syscall.SIGTERM)
	code := exitCode(t, p, 30*time.Second)
	took := time.Since(start)
	t.Logf("exit %d %.1fs after SIGTERM", code, took.Seconds())
	if took > 4*time.Second {
		t.Fatalf("an idle worker of a never-claimed pool took %.1fs to stop after its record was reaped: held for -lease-ttl with no lease possible", took.Seconds())
	}
}
