package registry

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// WorkerState is a worker's figures as Redis holds them (common.lua).
type WorkerState struct {
	// Status: "available", "retiring" (at its max_lifetime, the claim on
	// its way), "draining" (told to, or draining on its own), "replaced"
	// (draining, its replacement serving).
	Status        string
	Active        int
	Lifetime      int
	Capacity      int
	Cap           int
	LastHeartbeat time.Time
	SuspectUntil  time.Time
	Hold          bool
	PredictedEnd  time.Time
	Estimate      time.Duration
	// Durations are its last sessions' durations, oldest first (fair share).
	Durations []time.Duration
}

var statusNames = map[string]string{"a": "available", "r": "retiring", "d": "draining", "x": "replaced"}

// parseState reads common.lua's state value.
func parseState(v string) (WorkerState, bool) {
	f := strings.Fields(v)
	if len(f) != 10 || statusNames[f[0]] == "" {
		return WorkerState{}, false
	}
	var n [9]int64
	for i := range n {
		x, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil || x < 0 {
			return WorkerState{}, false
		}
		n[i] = x
	}
	ms := func(x int64) time.Time {
		if x == 0 {
			return time.Time{}
		}
		return time.UnixMilli(x)
	}
	return WorkerState{
		Status: statusNames[f[0]], Active: int(n[0]), Lifetime: int(n[1]), Capacity: int(n[2]), Cap: int(n[3]),
		LastHeartbeat: ms(n[4]), SuspectUntil: ms(n[5]), Hold: n[6] == 1, PredictedEnd: ms(n[7]),
		Estimate: time.Duration(n[8]) * time.Millisecond,
	}, true
}

// parseDurations reads the durations of a fair share history
// ("<window> <median> <default> <d1,d2,...>").
func parseDurations(v string) []time.Duration {
	f := strings.Fields(v)
	if len(f) < 4 {
		return nil
	}
	var out []time.Duration
	for _, x := range strings.Split(f[3], ",") {
		if ms, err := strconv.ParseInt(x, 10, 64); err == nil {
			out = append(out, time.Duration(ms)*time.Millisecond)
		}
	}
	return out
}

// stateHeartbeat is the heartbeat (Unix ms) of a state value.
func stateHeartbeat(v string) (int64, bool) {
	st, ok := parseState(v)
	if !ok {
		return 0, false
	}
	return st.LastHeartbeat.UnixMilli(), true
}

// WorkerInfo is one worker as a view shows it.
type WorkerInfo struct {
	Record
	WorkerState
	// Group is the version group it is in.
	Group string
}

// BadRecord is a worker entry that does not parse: skipped, never
// selected, removed by the reaper.
type BadRecord struct {
	ID, Group, Error string
}

// GroupInfo is one version group as Redis holds it.
type GroupInfo struct {
	Group      string
	Workers    []WorkerInfo
	BadRecords []BadRecord
	// Retiring lists the workers that count as retiring (stagger_drains).
	Retiring []string
	// Now is Redis' clock when it was read.
	Now time.Time
}

// Inspect reads a group: every worker with its state, the bad records
// and the retiring set. It reads O(N) and writes nothing: for views, not
// the request path.
func (r *Registry) Inspect(ctx context.Context, group string) (GroupInfo, error) {
	if err := CheckPool(group); err != nil {
		return GroupInfo{}, err
	}
	pipe := r.rdb.Pipeline()
	recs := pipe.HGetAll(ctx, r.Key(group, keyWorkers))
	states := pipe.HGetAll(ctx, r.Key(group, keyState))
	retiring := pipe.SMembers(ctx, r.Key(group, keyRetiring))
	now := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil {
		return GroupInfo{}, fmt.Errorf("reading pool %q: %w", group, err)
	}
	info := GroupInfo{Group: group, Retiring: retiring.Val(), Now: now.Val()}
	slices.Sort(info.Retiring)
	for id, raw := range recs.Val() {
		rec, err := DecodeRecord(id, raw)
		if err != nil {
			info.BadRecords = append(info.BadRecords, BadRecord{ID: id, Group: group, Error: err.Error()})
			continue
		}
		st, ok := parseState(states.Val()[id])
		st.Durations = parseDurations(states.Val()[id+" f"])
		if !ok {
			info.BadRecords = append(info.BadRecords, BadRecord{ID: id, Group: group, Error: "state does not parse"})
			continue
		}
		info.Workers = append(info.Workers, WorkerInfo{Record: rec, WorkerState: st, Group: group})
	}
	for id := range states.Val() {
		if _, ok := recs.Val()[id]; !ok && CheckID(id) == nil {
			info.BadRecords = append(info.BadRecords, BadRecord{ID: id, Group: group, Error: "state without a record"})
		}
	}
	slices.SortFunc(info.Workers, func(a, b WorkerInfo) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(info.BadRecords, func(a, b BadRecord) int { return strings.Compare(a.ID, b.ID) })
	return info, nil
}

// InspectPool reads every version group of a pool (the pool's own group
// first, then its versions oldest first), as Inspect does.
func (r *Registry) InspectPool(ctx context.Context, pool string) ([]GroupInfo, PoolVersions, error) {
	vs, err := r.Versions(ctx, pool)
	if err != nil {
		return nil, vs, err
	}
	pool, _ = SplitGroup(pool)
	groups := []string{pool}
	for _, v := range vs.Versions {
		groups = append(groups, GroupPool(pool, v))
	}
	out := make([]GroupInfo, 0, len(groups))
	for _, g := range groups {
		gi, err := r.Inspect(ctx, g)
		if err != nil {
			return nil, vs, err
		}
		out = append(out, gi)
	}
	return out, vs, nil
}

// Session is one session record.
type Session struct {
	ID      string
	Pool    string
	Version string
	Worker  string
	Claimed time.Time
	// State: "pending" (claimed, not yet seen by the agent), "live", or
	// "ending" (told to end).
	State string
	// Client is the hash of the client's key ("" none); Instance the Caddy
	// that claimed it; Label the client's own label.
	Client, Instance, Label string
	// Active is when a data frame last passed, as its agent last reported
	// (at most a heartbeat ago); Claimed until the agent reports it.
	Active time.Time
}

var sessionStates = map[string]string{"p": "pending", "q": "pending", "l": "live", "e": "ending"}

func parseSession(pool, id, v string) (Session, bool) {
	f := strings.SplitN(v, " ", 8)
	if len(f) < 7 || sessionStates[f[3]] == "" {
		return Session{}, false
	}
	ms, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		return Session{}, false
	}
	active, err := strconv.ParseInt(f[6], 10, 64)
	if err != nil {
		return Session{}, false
	}
	s := Session{ID: id, Pool: pool, Worker: f[0], Claimed: time.UnixMilli(ms), State: sessionStates[f[3]], Active: time.UnixMilli(active)}
	undash := func(x string) string {
		if x == "-" {
			return ""
		}
		return x
	}
	s.Version, s.Client, s.Instance = undash(f[1]), undash(f[4]), undash(f[5])
	if len(f) == 8 {
		s.Label = f[7]
	}
	return s, true
}

// Sessions reads one page of a pool's sessions (about count of them) from
// cursor (0: the first page); next is 0 after the last. Bounded work per
// call, read-only.
func (r *Registry) Sessions(ctx context.Context, pool string, cursor uint64, count int) (out []Session, next uint64, err error) {
	pool, _ = SplitGroup(pool)
	if err := CheckPool(pool); err != nil {
		return nil, 0, err
	}
	kvs, next, err := r.rdb.HScan(ctx, r.Key(pool, keySessions), cursor, "", int64(count)).Result()
	if err != nil {
		return nil, 0, fmt.Errorf("listing the sessions of pool %q: %w", pool, err)
	}
	for i := 0; i+1 < len(kvs); i += 2 {
		if s, ok := parseSession(pool, kvs[i], kvs[i+1]); ok {
			out = append(out, s)
		}
	}
	return out, next, nil
}

// GetSession reads one session; false when the pool has none by that ID.
func (r *Registry) GetSession(ctx context.Context, pool, id string) (Session, bool, error) {
	pool, _ = SplitGroup(pool)
	v, err := r.rdb.HGet(ctx, r.Key(pool, keySessions), id).Result()
	if err == redis.Nil {
		return Session{}, false, nil
	}
	if err != nil {
		return Session{}, false, fmt.Errorf("reading session %s of pool %q: %w", id, pool, err)
	}
	s, ok := parseSession(pool, id, v)
	return s, ok, nil
}
