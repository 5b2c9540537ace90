// Package registry is the one place that knows Redis: the key schema, the
// worker records and state, the session records, and the Lua functions
// that register, heartbeat, select and claim, end and reap
// (docs/design.md says which guarantee each serves).
package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// Sentinel errors; callers test them with errors.Is.
var (
	// ErrNoWorker: no worker of the group may take the session now.
	ErrNoWorker = errors.New("no eligible worker")
	// ErrBehind: a worker is free, but an older request in the pool's
	// queue may take it; the request waits its turn.
	ErrBehind = errors.New("an older request waits for the worker")
	// ErrClientLimit: the client holds its client_limit of live sessions.
	ErrClientLimit = errors.New("client holds its limit of sessions")
	// ErrNotRegistered: the worker has no record (it expired, or Redis
	// lost it); its agent registers again.
	ErrNotRegistered = errors.New("worker not registered")
	// ErrSchema: the pool was written by another schema of the registry.
	ErrSchema = errors.New("registry schema mismatch")
)

// DefaultPrefix starts every key unless Options.Prefix says otherwise.
const DefaultPrefix = "grid"

// PendingGrace is how long after its claim a session the agent does not
// report yet still counts: the claim is on its way to the agent. A
// heartbeat ends an unreported session older than that (its Caddy died
// between the claim and the dial).
const PendingGrace = 500 * time.Millisecond

// Options configure a Registry.
type Options struct {
	// Prefix of every key. Default: "grid".
	Prefix string
	// Rand draws a claim's random inputs (vnode's pivots, jitter and
	// tiebreak). Default: math/rand/v2's global source.
	Rand selection.Rand
}

// Registry talks to one Redis (single node, Sentinel or Cluster).
type Registry struct {
	rdb    redis.UniversalClient
	prefix string
	rand   selection.Rand
}

// New returns a Registry over rdb.
func New(rdb redis.UniversalClient, opts Options) *Registry {
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.Rand == nil {
		opts.Rand = globalRand{}
	}
	return &Registry{rdb: rdb, prefix: opts.Prefix, rand: opts.Rand}
}

// NewClient connects to the Redis a URL names: redis://, rediss:// (TLS),
// redis+cluster://h1:p1,h2:p2, redis+sentinel://master@h1:p1,h2:p2/db or
// unix://. Every client honours its caller's deadline and never resends a
// script that may have run (client.go).
func NewClient(url string) (redis.UniversalClient, error) { return newClient(url) }

// CheckURL reports why url is no Redis URL NewClient takes, without
// connecting; the error never holds the password.
func CheckURL(url string) error {
	c, err := newClient(url)
	if err != nil {
		return err
	}
	return c.Close()
}

// RedactURL returns url with any password replaced, fit for logs.
func RedactURL(url string) string { return redactURL(url) }

// Client is the Redis client the registry uses.
func (r *Registry) Client() redis.UniversalClient { return r.rdb }

// Status is what an agent says of a browser.
type Status string

// Statuses an agent reports.
const (
	// Serving: the browser takes sessions.
	Serving Status = "a"
	// Draining: the browser finishes its sessions and takes no more.
	Draining Status = "d"
	// Replaced: draining, and its replacement serves.
	Replaced Status = "x"
)

// AgentState is an agent's truth about one browser.
type AgentState struct {
	Status Status
	// Lifetime is how many sessions the browser has served.
	Lifetime int
	// Hold is set while the agent's previous browser still drains: this
	// one may not take its last session meanwhile.
	Hold bool
	// Sessions are the browser's live sessions.
	Sessions []LiveSession
}

// LiveSession is one session an agent relays.
type LiveSession struct {
	ID string
	// Client is the hash of the client's key the claim carried ("" none):
	// a session Redis lost comes back counted against its client_limit.
	Client string
	// Idle is how long no data frame has passed.
	Idle time.Duration
}

func (s AgentState) args() []any {
	st := s.Status
	if st == "" {
		st = Serving
	}
	hold := "0"
	if s.Hold {
		hold = "1"
	}
	return []any{string(st), s.Lifetime, hold}
}

// Register adds a browser to its group with the agent's state; replaces,
// when set, names the worker it replaces, which then stops counting as
// retiring.
func (r *Registry) Register(ctx context.Context, rec Record, st AgentState, replaces string) error {
	if err := rec.check(); err != nil {
		return err
	}
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := r.rdb.SAdd(ctx, r.poolsKey(), rec.Pool).Err(); err != nil {
		return fmt.Errorf("registering worker %s in pool %q: %w", rec.ID, rec.Pool, err)
	}
	version := rec.Version
	if version == "" {
		version = "-"
	}
	args := append([]any{rec.ID, string(raw), rec.Capacity}, st.args()...)
	args = append(args, replaces, version)
	for _, s := range st.Sessions {
		args = append(args, s.ID, orDash(s.Client), s.Idle.Milliseconds())
	}
	if _, err := r.fcall(ctx, "register", rec.Group(), false, args...); err != nil {
		return fmt.Errorf("registering worker %s in pool %q: %w", rec.ID, rec.Group(), err)
	}
	return nil
}

// HeartbeatReply is what a heartbeat tells the agent.
type HeartbeatReply struct {
	// Drain: an operator asked this worker to drain.
	Drain bool
	// End lists live sessions an operator ended.
	End []string
}

// Heartbeat reports the agent's state of one browser and rewrites the
// worker's counts from it (docs/design.md, "A heartbeat carries the
// agent's whole truth"). ErrNotRegistered: register again.
func (r *Registry) Heartbeat(ctx context.Context, group, id string, st AgentState) (HeartbeatReply, error) {
	args := append([]any{id}, st.args()...)
	args = append(args, PendingGrace.Milliseconds())
	for _, s := range st.Sessions {
		args = append(args, s.ID, orDash(s.Client), s.Idle.Milliseconds())
	}
	res, err := r.fcall(ctx, "heartbeat", group, false, args...)
	if err != nil {
		return HeartbeatReply{}, fmt.Errorf("heartbeat of worker %s in pool %q: %w", id, group, err)
	}
	out, _ := res.([]any)
	if len(out) == 0 || out[0] == "unregistered" {
		return HeartbeatReply{}, ErrNotRegistered
	}
	var rep HeartbeatReply
	if len(out) > 1 {
		rep.Drain = out[1] == int64(1)
	}
	for _, x := range out[min(2, len(out)):] {
		if s, ok := x.(string); ok {
			rep.End = append(rep.End, s)
		}
	}
	return rep, nil
}

// Ended is one session that ended, with how long it lasted.
type Ended struct {
	Session  string
	Duration time.Duration
}

// EndServed records that the sessions a browser served ended.
func (r *Registry) EndServed(ctx context.Context, group, worker string, ends []Ended) (int, error) {
	args := []any{worker, "s", 0}
	for _, e := range ends {
		args = append(args, e.Session, e.Duration.Milliseconds())
	}
	return r.end(ctx, group, args)
}

// GiveBack ends claims that were never served, their lifetime too: the
// agent refused them, or (Caddy) they never reached the agent. With
// failed, the worker failed them and every instance skips it for suspect.
func (r *Registry) GiveBack(ctx context.Context, group, worker string, failed bool, suspect time.Duration, sessions ...string) (int, error) {
	mode := "g"
	if failed {
		mode = "f"
	}
	args := []any{worker, mode, suspect.Milliseconds()}
	for _, s := range sessions {
		args = append(args, s, 0)
	}
	return r.end(ctx, group, args)
}

func (r *Registry) end(ctx context.Context, group string, args []any) (int, error) {
	res, err := r.fcall(ctx, "end", group, false, args...)
	if err != nil {
		return 0, fmt.Errorf("ending sessions of worker %v in pool %q: %w", args[0], group, err)
	}
	n, _ := res.(int64)
	return int(n), nil
}

// Deregister removes a browser's record and any session left on it.
func (r *Registry) Deregister(ctx context.Context, group, id string) error {
	if _, err := r.fcall(ctx, "deregister", group, false, id); err != nil {
		return fmt.Errorf("deregistering worker %s from pool %q: %w", id, group, err)
	}
	return nil
}

// Agent commands, sent on the agent's channel (AgentChannel).
const (
	// CommandDrain: drain the browser.
	CommandDrain = "drain"
	// commandEnd starts "end <session> <code> <reason>".
	commandEnd = "end"
)

// EndCommand is the command that ends a session with a WebSocket close
// code and a reason.
func EndCommand(session string, code int, reason string) string {
	return commandEnd + " " + session + " " + strconv.Itoa(code) + " " + reason
}

// ParseCommand reads a command of the agent's channel: drain, or end with
// its session, code and reason. cmd is "" for anything else.
func ParseCommand(msg string) (cmd, session string, code int, reason string) {
	if msg == CommandDrain {
		return CommandDrain, "", 0, ""
	}
	f := strings.SplitN(msg, " ", 4)
	if len(f) < 3 || f[0] != commandEnd {
		return "", "", 0, ""
	}
	c, err := strconv.Atoi(f[2])
	if err != nil {
		return "", "", 0, ""
	}
	if !SendableCloseCode(c) {
		c = 1000
	}
	if len(f) == 4 {
		reason = f[3]
	}
	return commandEnd, f[1], c, reason
}

// SendableCloseCode reports whether an endpoint may send code in a close
// frame (RFC 6455 7.4): 1000-1003, 1007-1014, or 3000-4999.
func SendableCloseCode(code int) bool {
	return code >= 1000 && code <= 1003 || code >= 1007 && code <= 1014 || code >= 3000 && code <= 4999
}

// Drain tells a worker to drain: it takes no new session from now on, and
// its agent hears it on its channel (or, should that message be lost, at
// its next heartbeat). false: no such worker.
func (r *Registry) Drain(ctx context.Context, group, id string) (bool, error) {
	res, err := r.fcall(ctx, "drain", group, false, id)
	if err != nil {
		return false, fmt.Errorf("draining worker %s of pool %q: %w", id, group, err)
	}
	if res != int64(1) {
		return false, nil
	}
	if err := r.rdb.Publish(ctx, r.AgentChannel(group, id), CommandDrain).Err(); err != nil {
		return true, fmt.Errorf("telling worker %s of pool %q to drain: %w", id, group, err)
	}
	return true, nil
}

// EndSession asks the agent holding a live session to end it with a
// WebSocket close code and reason. false: no such session in pool.
func (r *Registry) EndSession(ctx context.Context, pool, id string, code int, reason string) (bool, error) {
	res, err := r.fcall(ctx, "end_session", pool, false, id)
	if err != nil {
		return false, fmt.Errorf("ending session %s of pool %q: %w", id, pool, err)
	}
	out, _ := res.([]any)
	if len(out) < 2 {
		return false, nil
	}
	worker, _ := out[0].(string)
	version, _ := out[1].(string)
	if version == "-" {
		version = ""
	}
	group := GroupPool(pool, version)
	if err := r.rdb.Publish(ctx, r.AgentChannel(group, worker), EndCommand(id, code, reason)).Err(); err != nil {
		return true, fmt.Errorf("telling the agent of session %s to end it: %w", id, err)
	}
	return true, nil
}

// Reap removes a group's workers whose heartbeat is older than staleAfter
// (and those whose state does not parse), with their sessions. It reads
// the group's state in pages, so each call to Redis does bounded work.
// Safe to run in many places at once.
func (r *Registry) Reap(ctx context.Context, group string, staleAfter time.Duration) (int, error) {
	now, err := r.rdb.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("reaping pool %q: reading Redis' clock: %w", group, err)
	}
	cutoff := now.Add(-staleAfter).UnixMilli()
	removed := 0
	var cursor uint64
	for {
		kvs, next, err := r.rdb.HScan(ctx, r.Key(group, keyState), cursor, "", 256).Result()
		if err != nil {
			return removed, fmt.Errorf("reaping pool %q: %w", group, err)
		}
		args := []any{cutoff}
		for i := 0; i+1 < len(kvs); i += 2 {
			id, v := kvs[i], kvs[i+1]
			if CheckID(id) != nil {
				continue // a field of its own (" schema", "<id> f")
			}
			if hb, ok := stateHeartbeat(v); !ok || hb < cutoff {
				args = append(args, id)
			}
		}
		if len(args) > 1 {
			res, err := r.fcall(ctx, "reap", group, false, args...)
			if err != nil {
				return removed, fmt.Errorf("reaping pool %q: %w", group, err)
			}
			n, _ := res.(int64)
			removed += int(n)
		}
		if cursor = next; cursor == 0 {
			return removed, nil
		}
	}
}

// Pools lists the pools in the directory (names a Redis writer made up are
// left out).
func (r *Registry) Pools(ctx context.Context) ([]string, error) {
	names, err := r.rdb.SMembers(ctx, r.poolsKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("listing pools: %w", err)
	}
	out := names[:0]
	for _, p := range names {
		if CheckPool(p) == nil {
			out = append(out, p)
		}
	}
	return out, nil
}
