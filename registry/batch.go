package registry

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Group commit of claims and lease ends (issue 12). Each call to Redis
// costs Redis a round trip's kernel work and a function call's setup
// whatever the script does: on the measuring machine about 15–20 µs and
// 6 µs of a claim's ~50 (docs/perf/registry-profile.md). So that a busy
// pool does not pay them per session, one process sends at most one call
// of a script per pool at a time: a claim (or release) that arrives while
// one is in flight waits for it, and then every call that waited goes in
// the next call to Redis (<script>_many, manyLua), up to Options.MaxBatch.
// A call that finds none in flight goes at once, alone, as it always did:
// batching adds nothing to an idle pool and at most one call's time to a
// busy one. The calls of a batch run one after the other in one atomic
// script, as they would back to back; each caller gets its own reply or
// error, and returns only once its call ran.

// DefaultMaxBatch is Options.MaxBatch's default; MaxBatchCap its
// largest value: a batch holds Redis for all its calls (about 70 µs a
// claim here, so 18 ms at the cap), and every call's arguments count
// toward Redis' limit per command.
const (
	DefaultMaxBatch = 32
	MaxBatchCap     = 256
)

// batchJob is one call waiting for, or in, a batch.
type batchJob struct {
	ctx  context.Context
	args []any // the script's own ARGV, after the common three
	res  any
	err  error
	done chan struct{}
	// sent: the job left the queue (guarded by the queue's mu).
	sent bool
}

// callQueue is one script's calls for one pool in this process.
type callQueue struct {
	mu      sync.Mutex
	busy    bool // a call of this script for this pool is in flight
	waiting []*batchJob
}

// batcher holds the queues, by script and pool.
type batcher struct {
	queues sync.Map // batchKey -> *callQueue
}

type batchKey struct{ fn, pool string }

func (b *batcher) queue(f function, pool string) *callQueue {
	k := batchKey{f.name, pool}
	if q, ok := b.queues.Load(k); ok {
		return q.(*callQueue)
	}
	q, _ := b.queues.LoadOrStore(k, &callQueue{})
	return q.(*callQueue)
}

// maxBatchOf is n as MaxBatch takes it: DefaultMaxBatch for 0 (or
// less), at most MaxBatchCap.
func maxBatchOf(n int) int {
	if n <= 0 {
		return DefaultMaxBatch
	}
	return min(n, MaxBatchCap)
}

// SetMaxBatch changes Options.MaxBatch (taken as the option is) for the
// calls sent from now on: a Caddy reload that changes it keeps its
// registry. Calls already waiting go in the batches the new value makes.
func (r *Registry) SetMaxBatch(n int) { r.maxBatch.Store(int64(maxBatchOf(n))) }

// MaxBatch is the MaxBatch in force.
func (r *Registry) MaxBatch() int { return int(r.maxBatch.Load()) }

// runBatched runs f (a script with a _many function) for pool with its
// own ARGV args (now from Redis' clock), in a batch when a call of f for
// pool is in flight (see above). It returns the call's reply as run
// would give it (Cmd.Result). At MaxBatch 1 every call goes alone at
// once, past the queue (calls that waited before a change to 1 still go
// in their batches).
func (r *Registry) runBatched(ctx context.Context, f function, pool string, args ...any) (any, error) {
	if f.many == "" {
		panic("registry: " + f.name + " has no _many function")
	}
	if r.MaxBatch() > 1 {
		q := r.batch.queue(f, pool)
		q.mu.Lock()
		if q.busy {
			return r.wait(ctx, q, args)
		}
		// nothing in flight: this call goes alone, now, and the calls
		// that arrive meanwhile go after it
		q.busy = true
		q.mu.Unlock()
		defer r.nextBatch(q, f, pool)
	}
	return r.runAlone(ctx, f, pool, args)
}

// runAlone sends one call of f as its own FCALL.
func (r *Registry) runAlone(ctx context.Context, f function, pool string, args []any) (any, error) {
	r.sent(f, pool, 1)
	return r.run(ctx, f, pool, 0, args...).Result()
}

// wait queues a call behind the one in flight (q.mu held, released here)
// and returns its reply once a batch carried it, or the caller's context
// error if it gives up first.
func (r *Registry) wait(ctx context.Context, q *callQueue, args []any) (any, error) {
	j := &batchJob{ctx: ctx, args: args, done: make(chan struct{})}
	q.waiting = append(q.waiting, j)
	q.mu.Unlock()
	select {
	case <-j.done:
		return j.res, j.err
	case <-ctx.Done():
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !j.sent {
		// never sent: take it out, nothing ran
		q.waiting = slices.DeleteFunc(q.waiting, func(w *batchJob) bool { return w == j })
		return nil, fmt.Errorf("waiting for a call in flight: %w", ctx.Err())
	}
	// In flight: it may run, or have run, as a call whose caller gave up
	// may (the callers cancel or retry as for any failed call).
	return nil, ctx.Err()
}

// nextBatch sends the calls that waited while one was in flight, as one
// call, in the background; with none waiting, the queue is idle again.
// Calls whose callers gave up are not sent (each caller, once it has the
// lock, finds its call unsent and says so).
func (r *Registry) nextBatch(q *callQueue, f function, pool string) {
	most := r.MaxBatch()
	q.mu.Lock()
	defer q.mu.Unlock()
	var jobs []*batchJob
	for len(jobs) == 0 {
		if len(q.waiting) == 0 {
			q.busy = false
			return
		}
		n := 0
		for _, j := range q.waiting {
			if len(jobs) == most {
				break
			}
			n++
			if j.ctx.Err() == nil {
				j.sent = true
				jobs = append(jobs, j)
			}
		}
		q.waiting = slices.Clone(q.waiting[n:])
	}
	go func() {
		r.sendBatch(f, pool, jobs)
		r.nextBatch(q, f, pool)
	}()
}

// sendBatch runs jobs in one call (alone: the plain function) and hands
// each its reply. The call runs under its own context, until the latest
// of the jobs' deadlines: a caller that gives up does not fail the others.
func (r *Registry) sendBatch(f function, pool string, jobs []*batchJob) {
	defer func() {
		for _, j := range jobs {
			close(j.done)
		}
	}()
	ctx, cancel := batchContext(jobs)
	defer cancel()
	if len(jobs) == 1 {
		jobs[0].res, jobs[0].err = r.runAlone(ctx, f, pool, jobs[0].args)
		return
	}
	r.sent(f, pool, len(jobs))
	args := make([]any, 0, len(jobs)*(1+len(jobs[0].args)))
	for _, j := range jobs {
		args = append(args, len(j.args))
		args = append(args, j.args...)
	}
	res, err := r.run(ctx, f.manyFn(), pool, 0, args...).Slice()
	if err == nil && len(res) != len(jobs) {
		err = fmt.Errorf("calling %s: %d replies for %d batched calls", f.many, len(res), len(jobs))
	}
	for i, j := range jobs {
		switch {
		case err != nil:
			j.err = err
		case res[i] == nil:
			// false from Lua, as a lone call's reply (Cmd.Result gives redis.Nil)
			j.err = redis.Nil
		default:
			// an error reply is a redis.Error in the slice
			j.res = res[i]
			j.err, _ = res[i].(error)
			if j.err != nil {
				j.res = nil
			}
		}
	}
}

// sent tells Options.OnBatch how many calls one call to Redis carries.
func (r *Registry) sent(f function, pool string, calls int) {
	if r.opts.OnBatch != nil {
		r.opts.OnBatch(pool, f.script, calls)
	}
}

// batchContext is a batch's call context: not cancelled by any one
// caller, with the latest deadline among them (none when one has none).
func batchContext(jobs []*batchJob) (context.Context, context.CancelFunc) {
	var last time.Time
	for _, j := range jobs {
		d, ok := j.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.WithoutCancel(j.ctx))
		}
		if d.After(last) {
			last = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(jobs[0].ctx), last)
}
