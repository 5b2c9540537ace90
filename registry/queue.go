package registry

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// The pool's queue: requests waiting for a worker, across every Caddy
// instance sharing the Redis, in the order Redis saw them join. A claim
// yields to an older waiter that could take the worker it found
// (ErrBehind); the waiter is granted that worker for QueueGrant, after
// which the grant passes on. An instance keeps its waiters in the queue
// by calling QueueKeep at least every QueueKeep; waiters it stops keeping
// (a dead or cut-off instance) leave it.

const (
	// QueueGrant is how long a waiter holds a worker a younger request
	// found (queue.lua's GRANT_MS).
	QueueGrant = 250 * time.Millisecond
	// QueueKeepFor is how long a waiter stays queued without QueueKeep.
	QueueKeepFor = time.Second
)

// ClaimRequest.Waiter for a request that holds no place in the pool's
// queue: NotQueued yields to the queue's waiters, OwnQueue (an instance
// with shared_queue off, which queues on its own) ignores them.
const (
	NotQueued = ""
	OwnQueue  = "*"
)

// Waiter is one request waiting in a pool's queue.
type Waiter struct {
	// ID names it in Redis (CheckID).
	ID string
	// Versions are the Playwright versions of the pool's groups it may
	// claim in ("" the pool's own group); Avoid the workers it will not
	// take.
	Versions []string
	Avoid    []string
}

func (w Waiter) args() []any {
	vs := make([]string, len(w.Versions))
	for i, v := range w.Versions {
		vs[i] = orDash(v)
	}
	return []any{w.ID, strings.Join(vs, " "), strings.Join(w.Avoid, " ")}
}

// QueueState is a pool's queue as QueueKeep read it.
type QueueState struct {
	Depth      int
	OldestWait time.Duration
	// Served counts the requests ever served from the queue.
	Served int64
	// Positions are the kept waiters' places (0: first; -1: no longer
	// queued), in the order given.
	Positions []int
}

// QueueJoin adds w to pool's queue unless limit waiters wait already (0:
// no bound): ok false then. pos is its place, 0 first.
func (r *Registry) QueueJoin(ctx context.Context, pool string, w Waiter, limit int) (pos int, ok bool, err error) {
	if err := CheckID(w.ID); err != nil {
		return 0, false, fmt.Errorf("waiter %w", err)
	}
	args := append(w.args()[:3], limit, QueueKeepFor.Milliseconds())
	res, err := r.fcall(ctx, "queue_join", pool, false, args...)
	if err != nil {
		return 0, false, fmt.Errorf("joining the queue of pool %q: %w", pool, err)
	}
	out, _ := res.([]any)
	if len(out) < 2 {
		return 0, false, fmt.Errorf("joining the queue of pool %q: reply of %d items", pool, len(out))
	}
	return toInt(out[1]), toInt(out[0]) == 1, nil
}

// QueueKeep keeps ws (one instance's waiters of pool) queued for
// QueueKeepFor more and reads the queue.
func (r *Registry) QueueKeep(ctx context.Context, pool string, ws []Waiter) (QueueState, error) {
	args := []any{QueueKeepFor.Milliseconds()}
	for _, w := range ws {
		args = append(args, w.args()...)
	}
	res, err := r.fcall(ctx, "queue_keep", pool, false, args...)
	if err != nil {
		return QueueState{}, fmt.Errorf("keeping the queue of pool %q: %w", pool, err)
	}
	out, _ := res.([]any)
	if len(out) != 3+len(ws) {
		return QueueState{}, fmt.Errorf("keeping the queue of pool %q: reply of %d items", pool, len(out))
	}
	st := QueueState{Depth: toInt(out[0]), OldestWait: time.Duration(toInt(out[1])) * time.Millisecond, Served: int64(toInt(out[2]))}
	for _, p := range out[3:] {
		st.Positions = append(st.Positions, toInt(p))
	}
	return st, nil
}

// QueueLeave takes waiters out of pool's queue.
func (r *Registry) QueueLeave(ctx context.Context, pool string, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	if _, err := r.fcall(ctx, "queue_leave", pool, false, args...); err != nil {
		return fmt.Errorf("leaving the queue of pool %q: %w", pool, err)
	}
	return nil
}
