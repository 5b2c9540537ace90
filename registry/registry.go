package registry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/redis/go-redis/v9"
)

// Defaults of Options and of the figures a caller may leave at zero.
const (
	defaultPrefix         = "grid"
	defaultCommandTTL     = 60 * time.Second
	defaultDurationWindow = 20
	defaultLeaseSweep     = 64
	defaultRecordTTL      = 30 * time.Second
	defaultVirtualNodes   = 8
	defaultLeaseTTL       = 30 * time.Second
	defaultExpireLeases   = 1000
	defaultTombstoneTTL   = 10 * time.Minute
	// background expiry calls in flight per Registry, each of up to
	// expireBatch workers (Rivet's vnode design expires one per call, 32 per process).
	expireConcurrency = 8
	expireBatch       = 100
	expireTimeout     = 5 * time.Second
)

func newRegistry(rdb redis.UniversalClient, opts Options) *Registry {
	if opts.Prefix == "" {
		opts.Prefix = defaultPrefix
	}
	if opts.CommandTTL <= 0 {
		opts.CommandTTL = defaultCommandTTL
	}
	if opts.DurationWindow <= 0 {
		opts.DurationWindow = defaultDurationWindow
	}
	if opts.LeaseSweep <= 0 {
		opts.LeaseSweep = defaultLeaseSweep
	}
	if opts.TombstoneTTL <= 0 {
		opts.TombstoneTTL = defaultTombstoneTTL
	}
	r := &Registry{rdb: rdb, opts: opts, expireSlots: make(chan struct{}, expireConcurrency)}
	r.SetMaxBatch(opts.MaxBatch)
	return r
}

// Client returns the Redis client the registry uses.
func (r *Registry) Client() redis.UniversalClient { return r.rdb }

// run executes a pool script with the common ARGV (now, channel, pool).
func (r *Registry) run(ctx context.Context, f function, pool string, now int64, args ...any) *redis.Cmd {
	all := append([]any{now, r.channel(pool), pool}, args...)
	return r.fcall(ctx, f, false, r.poolKeys(pool), all...)
}

// runRO runs a script that only reads with FCALL_RO: a write inside it
// fails, and a client that routes reads to replicas (Cluster with
// ReadOnly) may send it to one.
func (r *Registry) runRO(ctx context.Context, f function, pool string, now int64, args ...any) *redis.Cmd {
	all := append([]any{now, r.channel(pool), pool}, args...)
	return r.fcall(ctx, f, true, r.poolKeys(pool), all...)
}

// fcall calls f (FCALL, or FCALL_RO when ro). When the server answers that
// the function does not exist (a Redis restarted empty or flushed, a
// promoted replica or a Cluster node that never had the library, a new
// version of the registry), nothing ran: fcall loads the library there and
// calls once more. Every other error goes back as it is (the retry guard
// in client.go has already retried what provably did not run).
func (r *Registry) fcall(ctx context.Context, f function, ro bool, keys []string, args ...any) *redis.Cmd {
	name, call := f.name, r.rdb.FCall
	if ro {
		if f.roFn == "" {
			panic("registry: " + f.name + " has no read-only function")
		}
		name, call = f.roFn, r.rdb.FCallRO
	}
	cmd := call(ctx, name, keys, args...)
	if !functionMissing(cmd.Err()) {
		return cmd
	}
	if err := f.lib.load(ctx, r.rdb, keys[0]); err != nil {
		cmd.SetErr(fmt.Errorf("calling %s: %w", name, err))
		return cmd
	}
	return call(ctx, name, keys, args...)
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

func (r *Registry) register(ctx context.Context, reg Registration) error {
	if err := checkPool(reg.Pool); err != nil {
		return fmt.Errorf("registering worker %q: %w", reg.ID, err)
	}
	if err := checkID(reg.ID); err != nil {
		return fmt.Errorf("registering a worker in pool %q: %w", reg.Pool, err)
	}
	switch {
	case reg.Addr == "":
		return fmt.Errorf("registering worker %q in pool %q: Addr is empty (want host:port)", reg.ID, reg.Pool)
	case reg.Capacity < 0:
		return fmt.Errorf("registering worker %q in pool %q: Capacity %d is negative", reg.ID, reg.Pool, reg.Capacity)
	case reg.TTL < 0:
		return fmt.Errorf("registering worker %q in pool %q: TTL %s is negative", reg.ID, reg.Pool, reg.TTL)
	case reg.VirtualNodes < 0 || reg.VirtualNodes > MaxVirtualNodes:
		return fmt.Errorf("registering worker %q in pool %q: VirtualNodes %d out of range 1-%d", reg.ID, reg.Pool, reg.VirtualNodes, MaxVirtualNodes)
	case reg.Lifetime < 0:
		return fmt.Errorf("registering worker %q in pool %q: Lifetime %d is negative", reg.ID, reg.Pool, reg.Lifetime)
	case reg.Hold < 0:
		return fmt.Errorf("registering worker %q in pool %q: Hold %s is negative", reg.ID, reg.Pool, reg.Hold)
	}
	if err := selection.ValidWeight(reg.Weight); err != nil {
		return fmt.Errorf("registering worker %q in pool %q: %w", reg.ID, reg.Pool, err)
	}
	draining, exclusive := 0, 0
	if reg.Draining {
		draining = 1
	}
	if reg.Exclusive {
		exclusive = 1
	}
	gen := reg.Generation
	if gen == "" {
		gen = NewGeneration()
	} else if err := checkToken(gen); err != nil {
		return fmt.Errorf("registering worker %q in pool %q: Generation: %w", reg.ID, reg.Pool, err)
	}
	// cjson stores these as bytes, and a proxy reads invalid UTF-8 as
	// U+FFFD (encoding/json): it would dial another path than the agent
	// gave, and the signature, made over the bytes, would never verify.
	for _, f := range [][2]string{{"Addr", reg.Addr}, {"Path", reg.Path}, {"BrowserType", reg.BrowserType}, {"Generation", gen}} {
		if !utf8.ValidString(f[1]) {
			return fmt.Errorf("registering worker %q in pool %q: %s %q is not valid UTF-8", reg.ID, reg.Pool, f[0], f[1])
		}
	}
	ttl := reg.TTL
	if ttl == 0 {
		ttl = defaultRecordTTL
	}
	v := reg.VirtualNodes
	if v == 0 {
		v = defaultVirtualNodes
	}
	pos := ringPositions(reg.ID, v)
	var sig string
	if len(reg.Secret) > 0 {
		sig = signRecord(reg.Secret, reg.Pool, reg.ID, reg.Addr, reg.Path, gen)
	}
	if err := r.rdb.SAdd(ctx, r.poolsKey(), reg.Pool).Err(); err != nil {
		return fmt.Errorf("registering worker %q in pool %q: adding the pool to %s: %w", reg.ID, reg.Pool, r.poolsKey(), err)
	}
	if err := r.noteVersion(ctx, reg.Pool); err != nil {
		return fmt.Errorf("registering worker %q in pool %q: noting its version: %w", reg.ID, reg.Pool, err)
	}
	err := r.run(ctx, scriptRegister, reg.Pool, 0,
		reg.ID, reg.BrowserType, reg.Addr, reg.Path, reg.Capacity, v, ms(ttl), gen, strings.Join(pos, " "),
		reg.Lifetime, ms(r.opts.CommandTTL), draining, sig, reg.weight(), ms(reg.Hold), exclusive).Err()
	if err != nil {
		return fmt.Errorf("registering worker %q in pool %q: %w", reg.ID, reg.Pool, err)
	}
	return nil
}

func (r *Registry) heartbeat(ctx context.Context, pool, id string, ttl time.Duration) (HeartbeatReply, error) {
	if err := checkPool(pool); err != nil {
		return HeartbeatReply{}, fmt.Errorf("heartbeat of worker %q: %w", id, err)
	}
	if ttl <= 0 {
		ttl = defaultRecordTTL
	}
	res, err := r.run(ctx, scriptHeartbeat, pool, 0, id, ms(ttl), r.opts.LeaseSweep, r.opts.DurationWindow, ms(r.opts.CommandTTL)).Slice()
	if err != nil {
		return HeartbeatReply{}, fmt.Errorf("heartbeat of worker %q in pool %q: %w", id, pool, err)
	}
	if len(res) < 2 {
		return HeartbeatReply{}, fmt.Errorf("heartbeat of worker %q in pool %q: unexpected reply %v", id, pool, res)
	}
	msg, _ := res[1].(string)
	if n, _ := res[0].(int64); n != 1 {
		if msg != "missing" && msg != "expired" {
			r.bad(pool, id, msg)
		}
		return HeartbeatReply{}, fmt.Errorf("heartbeat of worker %q in pool %q: record %s: %w", id, pool, msg, ErrNotRegistered)
	}
	if len(res) != 4 {
		return HeartbeatReply{}, fmt.Errorf("heartbeat of worker %q in pool %q: unexpected reply %v", id, pool, res)
	}
	lifetime, _ := res[2].(int64)
	active, _ := res[3].(int64)
	return HeartbeatReply{Command: Command(msg), Lifetime: int(lifetime), Active: int(active)}, nil
}

// update runs update.lua's op on one worker: 'draining' and 'command'
// with the shutdown command and its TTL, 'suspect' with the generation
// blamed (arg) and how long (d).
func (r *Registry) update(ctx context.Context, pool, id, op, arg string, d time.Duration) error {
	what := map[string]string{
		"draining": "marking worker %q of pool %q draining",
		"command":  "draining worker %q of pool %q",
		"suspect":  "marking worker %q of pool %q suspect",
	}[op]
	if err := checkPool(pool); err != nil {
		return fmt.Errorf(what+": %w", id, pool, err)
	}
	res, err := r.run(ctx, scriptUpdate, pool, 0, id, op, arg, ms(d)).Result()
	if err != nil {
		return fmt.Errorf(what+": %w", id, pool, err)
	}
	if s, ok := res.([]any); ok && len(s) == 2 {
		msg, _ := s[1].(string)
		if msg != "missing" {
			r.bad(pool, id, msg)
			return fmt.Errorf(what+": bad record (%s): %w", id, pool, msg, ErrNotRegistered)
		}
		return fmt.Errorf(what+": %w", id, pool, ErrNotRegistered)
	}
	return nil
}

func (r *Registry) expire(ctx context.Context, pool, id string, staleAfter time.Duration) (bool, error) {
	return r.expireCheck(ctx, pool, id, staleAfter, staleAfter > 0)
}

// expireCheck runs expire.lua; check re-reads freshness (skip_if_fresh).
func (r *Registry) expireCheck(ctx context.Context, pool, id string, staleAfter time.Duration, check bool) (bool, error) {
	if err := checkPool(pool); err != nil {
		return false, fmt.Errorf("expiring worker %q: %w", id, err)
	}
	c := 0
	if check {
		c = 1
	}
	n, err := r.run(ctx, scriptExpire, pool, 0, id, ms(staleAfter), c).Int()
	if err != nil {
		return false, fmt.Errorf("expiring worker %q of pool %q: %w", id, pool, err)
	}
	return n == 1, nil
}

// expireInBackground hands stale workers a claim walked past to
// expire_stale.lua (skip_if_fresh) in one background call per claim, up to
// expireBatch ids, skipping those this process is expiring already; at
// most expireConcurrency such calls run at once, more are dropped (a later
// claim or the reaper sees them again). It never changes the outcome of a
// claim.
func (r *Registry) expireInBackground(pool string, ids []string, staleAfter time.Duration) {
	var batch, keys []string
	for _, id := range ids {
		key := pool + "\x00" + id
		if _, busy := r.expiring.LoadOrStore(key, struct{}{}); busy {
			continue
		}
		batch, keys = append(batch, id), append(keys, key)
		if len(batch) == expireBatch {
			break
		}
	}
	if len(batch) == 0 {
		return
	}
	done := func() {
		for _, k := range keys {
			r.expiring.Delete(k)
		}
	}
	select {
	case r.expireSlots <- struct{}{}:
	default:
		done()
		return
	}
	go func() {
		defer func() { <-r.expireSlots; done() }()
		ctx, cancel := context.WithTimeout(context.Background(), expireTimeout)
		defer cancel()
		_, _ = r.expireStale(ctx, pool, batch, staleAfter)
	}()
}

// expireStale runs expire_stale.lua over ids, expireBatch at a time, and
// returns the ids removed.
func (r *Registry) expireStale(ctx context.Context, pool string, ids []string, staleAfter time.Duration) ([]string, error) {
	if err := checkPool(pool); err != nil {
		return nil, fmt.Errorf("expiring stale workers: %w", err)
	}
	var removed []string
	for len(ids) > 0 {
		n := min(len(ids), expireBatch)
		args := make([]any, 0, n+1)
		args = append(args, ms(staleAfter))
		for _, id := range ids[:n] {
			args = append(args, id)
		}
		got, err := r.run(ctx, scriptExpireStale, pool, 0, args...).StringSlice()
		if err != nil {
			return removed, fmt.Errorf("expiring %d stale workers of pool %q: %w", n, pool, err)
		}
		removed = append(removed, got...)
		ids = ids[n:]
	}
	return removed, nil
}

func (r *Registry) endLease(ctx context.Context, pool, leaseID, op string, suspectFor time.Duration) error {
	what := map[string]string{"release": "releasing", "undo": "undoing", "cancel": "cancelling"}[op]
	if op == "cancel" {
		op, suspectFor = "undo", 0
	}
	if err := checkPool(pool); err != nil {
		return fmt.Errorf("%s lease %q: %w", what, leaseID, err)
	}
	if suspectFor < 0 {
		suspectFor = 0
	}
	if leaseID == "" {
		return fmt.Errorf("%s a lease of pool %q: empty lease id", what, pool)
	}
	if _, err := r.runBatched(ctx, scriptLease, pool, op, r.opts.DurationWindow, leaseID, ms(suspectFor), ms(r.opts.TombstoneTTL)); err != nil {
		return fmt.Errorf("%s lease %q of pool %q: %w", what, leaseID, pool, err)
	}
	return nil
}

func (r *Registry) renewLeases(ctx context.Context, pool string, leases []LeaseRenewal, ttl time.Duration) (RenewResult, error) {
	if err := checkPool(pool); err != nil {
		return RenewResult{}, fmt.Errorf("renewing leases: %w", err)
	}
	if len(leases) == 0 {
		return RenewResult{}, nil
	}
	if ttl <= 0 {
		ttl = defaultLeaseTTL
	}
	var out RenewResult
	// One lease that cannot be renewed (a worker ID or generation taken
	// from a record that Redis writers control) must not stop the others:
	// it is reported as ended, so its holder stops renewing it.
	valid := make([]LeaseRenewal, 0, len(leases))
	for _, l := range leases {
		ok := l.Lifetime >= 0 && checkClientHash(l.Client) == nil
		for _, v := range []string{l.ID, l.Worker, l.Gen} {
			if checkToken(v) != nil {
				ok = false
			}
		}
		if ok {
			valid = append(valid, l)
		} else {
			out.Ended = append(out.Ended, l.ID)
		}
	}
	// Bounded calls: a renewal after a failover may re-create every lease.
	for len(valid) > 0 {
		n := min(len(valid), renewChunk)
		chunk := valid[:n]
		valid = valid[n:]
		args := make([]any, 0, 6+6*len(chunk))
		args = append(args, "renew", r.opts.DurationWindow, ms(ttl), ms(r.opts.CommandTTL), "renewal")
		for _, l := range chunk {
			args = append(args, l.ID, l.Worker, l.Gen, toMS(l.Claimed), l.Lifetime, l.Client)
		}
		res, err := r.run(ctx, scriptLease, pool, 0, args...).Slice()
		if err != nil {
			return out, fmt.Errorf("renewing %d leases of pool %q: %w", len(chunk), pool, err)
		}
		if len(res) != 2 {
			return out, fmt.Errorf("renewing %d leases of pool %q: unexpected reply %v", len(chunk), pool, res)
		}
		strs := func(v any) []string {
			xs, _ := v.([]any)
			var ss []string
			for _, x := range xs {
				if s, ok := x.(string); ok {
					ss = append(ss, s)
				}
			}
			return ss
		}
		out.Recreated = append(out.Recreated, strs(res[0])...)
		out.Ended = append(out.Ended, strs(res[1])...)
	}
	return out, nil
}

// renewChunk is how many leases one renewal call carries.
const renewChunk = 200

func (r *Registry) epochs(ctx context.Context, pools []string) (map[string]string, error) {
	cmds := make([]*redis.StringCmd, len(pools))
	pipe := r.rdb.Pipeline()
	for i, pool := range pools {
		if err := checkPool(pool); err != nil {
			return nil, fmt.Errorf("reading epochs: %w", err)
		}
		cmds[i] = pipe.HGet(ctx, r.Key(pool, keyConfig), "epoch")
	}
	// Exec's error is not always each answer's: a connection whose setup
	// Redis refused (AUTH, SELECT) fails the pipeline and leaves every
	// answer empty, with no error of its own (go-redis copies only network
	// errors to the commands). Exec names the first failed command only,
	// and a missing field fails as redis.Nil, so past that each answer is
	// checked on its own.
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("reading the epochs of %d pools: %w", len(pools), err)
	}
	out := make(map[string]string, len(pools))
	for i, pool := range pools {
		// redis.Nil: the pool has no epoch
		if err := cmds[i].Err(); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("reading the epoch of pool %q: %w", pool, err)
		}
		out[pool] = cmds[i].Val()
	}
	return out, nil
}

func (r *Registry) markEpoch(ctx context.Context, pool string) (string, error) {
	if err := checkPool(pool); err != nil {
		return "", fmt.Errorf("marking the epoch: %w", err)
	}
	e, err := r.run(ctx, scriptLease, pool, 0, "epoch", r.opts.DurationWindow, newToken(8)).Text()
	if err != nil {
		return "", fmt.Errorf("marking the epoch of pool %q: %w", pool, err)
	}
	if e == "" {
		return "", fmt.Errorf("marking the epoch of pool %q: Redis answered an empty epoch", pool)
	}
	return e, nil
}

func (r *Registry) assertLifetimes(ctx context.Context, pool string, floors []LifetimeFloor) (AssertResult, error) {
	var out AssertResult
	if err := checkPool(pool); err != nil {
		return out, fmt.Errorf("asserting lifetimes: %w", err)
	}
	valid := make([]LifetimeFloor, 0, len(floors))
	for _, f := range floors {
		// worker IDs and generations come from records Redis writers
		// control: one that could not be sent is skipped, not fatal
		if f.Lifetime > 0 && checkToken(f.Worker) == nil && checkToken(f.Gen) == nil {
			valid = append(valid, f)
		}
	}
	for len(valid) > 0 {
		n := min(len(valid), renewChunk)
		chunk := valid[:n]
		valid = valid[n:]
		args := make([]any, 0, 3+3*len(chunk))
		args = append(args, "floor", r.opts.DurationWindow, ms(r.opts.CommandTTL))
		for _, f := range chunk {
			args = append(args, f.Worker, f.Gen, f.Lifetime)
		}
		res, err := r.run(ctx, scriptLease, pool, 0, args...).Int64Slice()
		if err != nil {
			return out, fmt.Errorf("asserting %d lifetimes in pool %q: %w", len(chunk), pool, err)
		}
		if len(res) != 2 {
			return out, fmt.Errorf("asserting %d lifetimes in pool %q: unexpected reply %v", len(chunk), pool, res)
		}
		out.Raised += int(res[0])
		out.Kept += int(res[1])
	}
	return out, nil
}

func (r *Registry) expireLeases(ctx context.Context, pool string, max int) (int, error) {
	if err := checkPool(pool); err != nil {
		return 0, fmt.Errorf("expiring leases: %w", err)
	}
	if max <= 0 {
		max = defaultExpireLeases
	}
	n, err := r.run(ctx, scriptLease, pool, 0, "expire", r.opts.DurationWindow, max).Int()
	if err != nil {
		return 0, fmt.Errorf("expiring leases of pool %q: %w", pool, err)
	}
	return n, nil
}

// subscribeTimeout bounds the wait for Redis to confirm a wake-up
// subscription (Receive alone waits for ever when Redis hangs).
const subscribeTimeout = 5 * time.Second

func (r *Registry) wakeups(ctx context.Context, pools []string) (<-chan string, error) {
	if len(pools) == 0 {
		return nil, errors.New("subscribing to wakeups: no pool given")
	}
	chans := make([]string, len(pools))
	for i, p := range pools {
		if err := checkPool(p); err != nil {
			return nil, fmt.Errorf("subscribing to wakeups: %w", err)
		}
		chans[i] = r.channel(p)
	}
	sub := r.rdb.Subscribe(ctx, chans...)
	// Wait for the subscription to be in place, so no wakeup published after
	// this returns is missed.
	for range chans {
		if _, err := sub.ReceiveTimeout(ctx, subscribeTimeout); err != nil {
			sub.Close()
			return nil, fmt.Errorf("subscribing to wakeups of %v: %w", pools, err)
		}
	}
	out := make(chan string, 64)
	msgs := sub.Channel()
	go func() {
		defer close(out)
		defer sub.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case m, ok := <-msgs:
				if !ok {
					return
				}
				// A wakeup is a hint: when the reader lags, drop it rather than
				// block the subscription (waiters also poll slowly).
				select {
				case out <- m.Payload:
				default:
				}
			}
		}
	}()
	return out, nil
}

func (r *Registry) pools(ctx context.Context) ([]string, error) {
	ps, err := r.rdb.SMembers(ctx, r.poolsKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("listing pools in %s: %w", r.poolsKey(), err)
	}
	slices.Sort(ps)
	return ps, nil
}

// readChunk is the number of workers one read.lua call reads (HSCAN
// COUNT): well under a millisecond of Redis time.
const readChunk = 100

// read runs read.lua for one worker (id) or the whole pool (id ""), the
// pool in chunks (see read.lua); figures other than rows are the first
// chunk's.
func (r *Registry) read(ctx context.Context, pool, id string) (now int64, leases int, cfg map[string]string, rows []rawWorker, retiring []string, err error) {
	cursor := "0"
	seen := map[string]bool{}
	for first := true; ; first = false {
		args, err := newArgv(readArgsLayout).set("id", id).set("cursor", cursor).set("chunk", readChunk).list()
		if err != nil {
			return 0, 0, nil, nil, nil, err
		}
		res, err := r.runRO(ctx, scriptRead, pool, 0, args...).Slice()
		if err != nil {
			return 0, 0, nil, nil, nil, err
		}
		rep, err := decodeReply(readReplyLayout, res)
		if err != nil {
			return 0, 0, nil, nil, nil, err
		}
		if first {
			now = rep.int("now")
			leases = int(rep.int("leases"))
			cfg = map[string]string{}
			flat := rep.strs("config")
			for i := 0; i+1 < len(flat); i += 2 {
				cfg[flat[i]] = flat[i+1]
			}
			retiring = append(retiring, rep.strs("retiring")...)
		}
		cells, _ := rep.get("rows").([]any)
		width := len(readRowLayout.names)
		for i := 0; i+width-1 < len(cells); i += width {
			row := reply{l: readRowLayout, vals: cells[i : i+width]}
			id := row.str("id")
			if seen[id] {
				continue // HSCAN may return a field twice
			}
			seen[id] = true
			rows = append(rows, rawWorker{id: id, record: row.str("record"), active: row.str("active"),
				lifetime: row.str("lifetime"), durations: row.str("durations"), command: row.str("command"), hot: row.str("hot")})
		}
		cursor = rep.str("cursor")
		if cursor == "0" || cursor == "" {
			break
		}
	}
	slices.Sort(retiring)
	return now, leases, cfg, rows, retiring, nil
}

func (r *Registry) worker(ctx context.Context, pool, id string) (WorkerInfo, error) {
	if err := checkPool(pool); err != nil {
		return WorkerInfo{}, fmt.Errorf("reading worker %q: %w", id, err)
	}
	now, _, _, rows, _, err := r.read(ctx, pool, id)
	if err != nil {
		return WorkerInfo{}, fmt.Errorf("reading worker %q of pool %q: %w", id, pool, err)
	}
	if len(rows) == 0 {
		return WorkerInfo{}, fmt.Errorf("reading worker %q of pool %q: %w", id, pool, ErrNotRegistered)
	}
	w, err := decodeWorker(pool, rows[0], now)
	if err != nil {
		r.bad(pool, id, err.Error())
		return WorkerInfo{}, fmt.Errorf("reading worker %q of pool %q: bad record: %w", id, pool, err)
	}
	return w, nil
}

func (r *Registry) inspect(ctx context.Context, pool string) (PoolInfo, error) {
	if err := checkPool(pool); err != nil {
		return PoolInfo{}, fmt.Errorf("inspecting pool: %w", err)
	}
	now, leases, cfg, rows, retiring, err := r.read(ctx, pool, "")
	if err != nil {
		return PoolInfo{}, fmt.Errorf("inspecting pool %q: %w", pool, err)
	}
	info := PoolInfo{Pool: pool, Now: msTime(now), Leases: leases, Workers: []WorkerInfo{}, Retiring: retiring}
	atoi := func(k string) int { n, _ := strconv.Atoi(cfg[k]); return n }
	info.Limits = selection.Limits{
		MaxConcurrent: atoi("max_concurrent"),
		MaxLifetime:   atoi("max_lifetime"),
		StaleAfter:    time.Duration(atoi("stale_after_ms")) * time.Millisecond,
		MaxScan:       atoi("max_scan"),
		StaggerDrains: cfg["stagger_drains"] == "1",
	}
	// the fields are named as the pool's keys are ("v=1.65:ix" for a
	// version group: Key), less the hash tag
	info.Indexes = indexStates(pool, strings.TrimPrefix(r.Key(pool, "ix"), r.tag(pool)+":"), cfg)
	slices.SortFunc(rows, func(a, b rawWorker) int { return strings.Compare(a.id, b.id) })
	for _, row := range rows {
		w, err := decodeWorker(pool, row, now)
		if err != nil {
			info.BadRecords = append(info.BadRecords, BadRecord{ID: row.id, Err: err.Error()})
			r.bad(pool, row.id, err.Error())
			continue
		}
		info.Workers = append(info.Workers, w)
	}
	return info, nil
}

// ReconcileResult is what one Reconcile pass fixed.
type ReconcileResult struct {
	// LeasesFreed: expired leases whose slots were given back.
	LeasesFreed int
	// CountersFixed: workers whose active count or index membership
	// (retiring set included) was wrong.
	CountersFixed int
	// OrphansRemoved: index entries, ring positions, counters and retiring
	// set members of no record.
	OrphansRemoved int
	// BadRecords seen (also passed to Options.OnBadRecord).
	BadRecords []BadRecord
}

// Chunk sizes of the reconcile pass's calls (see reconcile.lua): each call
// stays around a millisecond of Redis time at any pool size.
const (
	reconcileLeases  = 100 // expired leases freed per call
	reconcileWorkers = 16  // workers checked per call (HSCAN COUNT)
	reconcileScan    = 200 // entries of one key per call (HSCAN/SSCAN COUNT; ZSCAN half)
	reconcileCount   = 100 // workers whose count is set per call
	leaseScanCount   = 500 // leases read per HSCAN
)

// reconcileKeys are the keys the scan stage walks, by reconcile.lua's names.
var reconcileKeys = []string{"lf", "fsi", "fsb", "fsp", "ring", "iwrr", "active", "lifetime", "durations", "commands", "vnodes", "hot", "lapsed", "retiring"}

// reconcile runs reconcile.lua's stages over the pool, each in bounded
// calls (cursor passes). The pass is not atomic: what changes meanwhile is
// either seen or left to the next pass, never miscounted (see the count
// stage).
func (r *Registry) reconcile(ctx context.Context, pool string) (ReconcileResult, error) {
	var out ReconcileResult
	if err := checkPool(pool); err != nil {
		return out, fmt.Errorf("reconciling pool: %w", err)
	}
	fail := func(what string, err error) (ReconcileResult, error) {
		return out, fmt.Errorf("reconciling pool %q: %s: %w", pool, what, err)
	}
	n := func(v any) int { x, _ := v.(int64); return int(x) }
	for {
		res, err := r.run(ctx, scriptReconcile, pool, 0, "leases", r.opts.DurationWindow, reconcileLeases).Slice()
		if err != nil || len(res) != 2 {
			return fail("freeing expired leases", replyErr(err, res))
		}
		out.LeasesFreed += n(res[0])
		// (tombstones share lease_expiry: a call may free fewer leases
		// than it handled entries)
		if n(res[1]) == 0 {
			break
		}
	}
	// lease_owner first: claims and releases derive active counts from it
	// (and lease_client, per-client counts).
	for _, key := range []string{"leases", "owner", "client"} {
		if err := r.reconcileScan(ctx, pool, key, &out); err != nil {
			return fail("repairing lease_owner and lease_client ("+key+")", err)
		}
	}
	// The workers, as they are before the leases are counted.
	type seen struct {
		gen              string
		lifetime, active int
	}
	workers := map[string]seen{}
	cursor := "0"
	for {
		res, err := r.run(ctx, scriptReconcile, pool, 0, "workers", cursor, reconcileWorkers).Slice()
		if err != nil || len(res) != 4 {
			return fail("checking workers", replyErr(err, res))
		}
		out.CountersFixed += n(res[1])
		out.BadRecords = append(out.BadRecords, r.badList(pool, res[2])...)
		rows, _ := res[3].([]any)
		for i := 0; i+3 < len(rows); i += 4 {
			id, _ := rows[i].(string)
			gen, _ := rows[i+1].(string)
			workers[id] = seen{gen: gen, lifetime: n(rows[i+2]), active: n(rows[i+3])}
		}
		cursor, _ = res[0].(string)
		if cursor == "0" || cursor == "" {
			break
		}
	}
	// Live leases per worker of its current generation.
	leases := map[string][]string{}
	var lc uint64
	for {
		kv, next, err := r.rdb.HScan(ctx, r.Key(pool, keyLeases), lc, "", leaseScanCount).Result()
		if err != nil {
			return fail("reading leases", err)
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if isTombstone(kv[i+1]) {
				continue
			}
			var l struct {
				Worker string `json:"worker"`
				Gen    string `json:"gen"`
			}
			if json.Unmarshal([]byte(kv[i+1]), &l) != nil {
				continue
			}
			if w, ok := workers[l.Worker]; ok && w.gen == l.Gen && !slices.Contains(leases[l.Worker], kv[i]) {
				leases[l.Worker] = append(leases[l.Worker], kv[i])
			}
		}
		lc = next
		if lc == 0 {
			break
		}
	}
	var args []any
	groups := 0
	flush := func() error {
		if groups == 0 {
			return nil
		}
		res, err := r.run(ctx, scriptReconcile, pool, 0, append([]any{"count"}, args...)...).Slice()
		if err != nil || len(res) != 1 {
			return replyErr(err, res)
		}
		out.CountersFixed += n(res[0])
		args, groups = args[:0], 0
		return nil
	}
	ids := make([]string, 0, len(workers))
	for id := range workers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		w, ls := workers[id], leases[id]
		if w.active == len(ls) {
			continue
		}
		args = append(args, id, w.gen, w.lifetime, len(ls))
		for _, l := range ls {
			args = append(args, l)
		}
		if groups++; groups == reconcileCount || len(args) > 4*reconcileCount {
			if err := flush(); err != nil {
				return fail("setting active counts", err)
			}
		}
	}
	if err := flush(); err != nil {
		return fail("setting active counts", err)
	}
	for _, key := range reconcileKeys {
		if err := r.reconcileScan(ctx, pool, key, &out); err != nil {
			return fail("cleaning "+key, err)
		}
	}
	return out, nil
}

// reconcileScan runs reconcile.lua's scan stage over one key, a bounded
// chunk per call, until its cursor comes back to 0.
func (r *Registry) reconcileScan(ctx context.Context, pool, key string, out *ReconcileResult) error {
	n := func(v any) int { x, _ := v.(int64); return int(x) }
	cursor := "0"
	for {
		res, err := r.run(ctx, scriptReconcile, pool, 0, "scan", key, cursor, reconcileScan).Slice()
		if err != nil || len(res) != 3 {
			return replyErr(err, res)
		}
		out.CountersFixed += n(res[1])
		out.OrphansRemoved += n(res[2])
		cursor, _ = res[0].(string)
		if cursor == "0" || cursor == "" {
			return nil
		}
	}
}

// replyErr is err, or an error saying a script's reply had the wrong shape.
func replyErr(err error, res []any) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("unexpected reply of %d items", len(res))
}

// ReaperLock takes the pool's reaper lock so that of many reapers only
// one works on a pool at a time. ok is false when another holds it. The
// lock lives ttl and is renewed every ttl/3 until release, which gives it
// back (only if still held by this caller): a reaper that dies mid-pass
// keeps the pool locked for at most ttl, however long passes may take.
func (r *Registry) ReaperLock(ctx context.Context, pool string, ttl time.Duration) (release func(context.Context) error, ok bool, err error) {
	if err := checkPool(pool); err != nil {
		return nil, false, fmt.Errorf("locking pool for the reaper: %w", err)
	}
	key := r.Key(pool, keyReaperLock)
	token := newToken(12)
	ok, err = r.rdb.SetNX(ctx, key, token, ttl).Result()
	if err != nil {
		return nil, false, fmt.Errorf("locking pool %q for the reaper: %w", pool, err)
	}
	if !ok {
		return nil, false, nil
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	var once sync.Once
	go func() {
		defer close(stopped)
		t := time.NewTicker(max(ttl/3, time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				rctx, cancel := context.WithTimeout(context.Background(), ttl/3)
				n, err := r.fcall(rctx, scriptUnlock, false, []string{key}, token, ms(ttl)).Int()
				cancel()
				if err == nil && n == 0 {
					return // lost (it expired and another took it): nothing to renew
				}
			}
		}
	}()
	return func(ctx context.Context) error {
		once.Do(func() { close(stop) })
		<-stopped
		if err := r.fcall(ctx, scriptUnlock, false, []string{key}, token).Err(); err != nil {
			return fmt.Errorf("unlocking pool %q after the reaper: %w", pool, err)
		}
		return nil
	}, true, nil
}

// badList turns a flat {id, reason, ...} reply into BadRecords and reports them.
func (r *Registry) badList(pool string, v any) []BadRecord {
	flat, _ := v.([]any)
	var out []BadRecord
	for i := 0; i+1 < len(flat); i += 2 {
		id, _ := flat[i].(string)
		why, _ := flat[i+1].(string)
		out = append(out, BadRecord{ID: id, Err: why})
		r.bad(pool, id, why)
	}
	return out
}

func (r *Registry) bad(pool, id, why string) {
	if r.opts.OnBadRecord != nil {
		r.opts.OnBadRecord(pool, id, errors.New(why))
	}
}

// newToken returns n random bytes as hex (lease IDs, generations, lock tokens).
func newToken(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// indexStates reads which optional indexes pool (or a version group)
// keeps from the pool's config hash: fields field ('ix', a group's
// 'v=<version>:ix') and field + ':<name>'.
func indexStates(pool, field string, cfg map[string]string) []IndexState {
	// the optional indexes, by the name the config hash uses, from the
	// policy table
	var walkers []PolicySpec
	settled := cfg[field] != ""
	for _, p := range policies {
		if p.index != "" {
			walkers = append(walkers, p)
			settled = settled || cfg[field+":"+p.index] != ""
		}
	}
	var out []IndexState
	for _, p := range walkers {
		st := IndexState{Pool: pool, Name: p.index, Policy: p.Name, State: "kept"}
		if settled {
			v := cfg[field+":"+p.index]
			if v == "" {
				continue
			}
			state, used, _ := strings.Cut(v, " ")
			st.State = "building"
			if state == "on" {
				st.State = "complete"
			}
			if ms, err := strconv.ParseInt(used, 10, 64); err == nil {
				st.LastWalked = time.UnixMilli(ms)
			}
		}
		out = append(out, st)
	}
	return out
}
