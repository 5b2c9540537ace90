package registry

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// The Lua walks are checked against selection/, the reference: after every
// step of a random life of a pool (claims, ends, heartbeats, drains,
// replacements, stale and suspect workers), the worker a claim would take
// (Pick) is the one selection chooses from a snapshot of the same pool,
// with the same random draws.

// equivalenceSteps is how many steps each random pool lives.
const equivalenceSteps = 60

// equivalenceTrials is how many random pools each policy lives through.
var equivalenceTrials = 12

func TestWalksChooseAsSelectionDoes(t *testing.T) {
	srv, _ := newTestRegistry(t)
	for _, pol := range Policies() {
		t.Run(string(pol), func(t *testing.T) {
			for trial := range equivalenceTrials {
				seed := uint64(trial)*7919 + uint64(len(pol))
				runEquivalence(t, srv, pol, seed)
			}
		})
	}
}

type eqPool struct {
	t        *testing.T
	ops      *Registry // the steps' registry
	pick     *Registry // Pick's, with the draws selection gets too
	draws    *rand.Rand
	rnd      *rand.Rand
	policy   Policy
	req      ClaimRequest
	ids      []string
	sessions map[string][]string // worker -> its sessions the agent reports
	next     int
}

func runEquivalence(t *testing.T, base *Registry, pol Policy, seed uint64) {
	ctx := context.Background()
	if err := base.rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	rnd := rand.New(rand.NewPCG(seed, 1))
	p := &eqPool{
		t: t, ops: base, policy: pol, rnd: rnd, sessions: map[string][]string{},
		pick:  New(base.rdb, Options{Rand: rand.New(rand.NewPCG(seed, 2))}),
		draws: rand.New(rand.NewPCG(seed, 2)),
	}
	p.req = ClaimRequest{
		Group: "eq", Policy: pol, StaleAfter: 10 * time.Second,
		Limits: Limits{MaxConcurrent: rnd.IntN(4), StaggerDrains: rnd.IntN(2) == 0},
	}
	if rnd.IntN(3) > 0 {
		p.req.Limits.MaxLifetime = 3 + rnd.IntN(10)
	}
	if rnd.IntN(2) == 0 {
		p.req.MaxScan = 2 + rnd.IntN(6)
	}
	switch pol {
	case Vnode:
		p.req.Options = VnodeOptions{Samples: 1 + rnd.IntN(3), SlotJitter: rnd.IntN(4)}
	case FairShare:
		p.req.Options = FairShareOptions{Window: selection.DefaultWindow, Default: selection.DefaultEstimate}
	}
	for range 2 + rnd.IntN(14) {
		p.addWorker("")
	}
	for step := range equivalenceSteps {
		p.step()
		p.compare(fmt.Sprintf("seed %d step %d", seed, step))
	}
}

func (p *eqPool) addWorker(replaces string) {
	p.next++
	id := fmt.Sprintf("w%02d", p.next)
	rec := NewRecord(Record{ID: id, Pool: "eq", Browser: "chromium", Addr: "127.0.0.1:9", Path: "/p",
		Capacity: p.rnd.IntN(4), Weight: 1 + p.rnd.IntN(4)}, 0, nil)
	if err := p.ops.Register(context.Background(), rec, AgentState{}, replaces); err != nil {
		p.t.Fatal(err)
	}
	p.ids = append(p.ids, id)
}

// edit rewrites fields of a worker's state string directly, for what no
// call produces at will: an old heartbeat, a suspect worker, a predicted
// end that has passed.
func (p *eqPool) edit(id string, field int, value int64) {
	ctx := context.Background()
	v, err := p.ops.rdb.HGet(ctx, p.ops.Key("eq", keyState), id).Result()
	if err != nil {
		return
	}
	f := strings.Fields(v)
	f[field] = strconv.FormatInt(value, 10)
	p.ops.rdb.HSet(ctx, p.ops.Key("eq", keyState), id, strings.Join(f, " "))
}

func (p *eqPool) step() {
	ctx := context.Background()
	id := p.ids[p.rnd.IntN(len(p.ids))]
	now := time.Now().UnixMilli()
	switch k := p.rnd.IntN(20); {
	case k < 8: // a claim
		req := p.req
		req.Session = newSession()
		if c, _, err := p.ops.Claim(ctx, req); err == nil {
			p.sessions[c.Worker.ID] = append(p.sessions[c.Worker.ID], c.Session)
		}
	case k < 11: // a session ends
		if ss := p.sessions[id]; len(ss) > 0 {
			i := p.rnd.IntN(len(ss))
			d := time.Duration(60+p.rnd.IntN(120)) * time.Second
			p.ops.EndServed(ctx, "eq", id, []Ended{{Session: ss[i], Duration: d}})
			p.sessions[id] = append(ss[:i], ss[i+1:]...)
		}
	case k < 14: // a heartbeat
		st := state(p.t, p.ops, "eq", id)
		as := AgentState{Lifetime: st.Lifetime, Sessions: live(p.sessions[id]...), Hold: p.rnd.IntN(4) == 0}
		if p.req.Limits.MaxLifetime > 0 && st.Lifetime >= p.req.Limits.MaxLifetime || st.Status == "draining" {
			as.Status = Draining
		}
		if st.Status == "replaced" {
			as.Status = Replaced
		}
		p.ops.Heartbeat(ctx, "eq", id, as)
	case k < 15:
		p.ops.Drain(ctx, "eq", id)
	case k < 16:
		p.addWorker(id)
	case k < 17:
		p.edit(id, 5, 1) // stale
	case k < 18:
		p.edit(id, 6, now+60_000) // suspect
	case k < 19: // its predicted end passed: it is where time would leave it
		pe := now - int64(p.rnd.IntN(100_000))
		p.edit(id, 8, pe)
		if sc, err := p.ops.rdb.ZScore(ctx, p.ops.Key("eq", keyIdxBusy), id).Result(); err == nil {
			st := state(p.t, p.ops, "eq", id)
			_ = sc
			p.ops.rdb.ZAdd(ctx, p.ops.Key("eq", keyIdxBusy), redis.Z{Score: float64(pe + st.Estimate.Milliseconds()), Member: id})
		}
	default:
		p.ops.GiveBack(ctx, "eq", id, false, 0, p.sessions[id]...)
		p.sessions[id] = nil
	}
}

var snapshotStatus = map[string]selection.Status{
	"available": selection.Available, "retiring": selection.Draining, "draining": selection.Draining, "replaced": selection.Replaced,
}

func (p *eqPool) compare(where string) {
	ctx := context.Background()
	info, err := p.ops.Inspect(ctx, "eq")
	if err != nil {
		p.t.Fatal(err)
	}
	ws := make([]selection.Worker, len(info.Workers))
	for i, w := range info.Workers {
		ws[i] = selection.Worker{
			ID: w.ID, Status: snapshotStatus[w.Status], Active: w.Active, Lifetime: w.Lifetime,
			Capacity: w.Record.Capacity, Weight: w.Weight, LastHeartbeat: w.LastHeartbeat,
			SuspectUntil: w.SuspectUntil, Durations: w.Durations, PredictedEnd: w.PredictedEnd, Hold: w.Hold,
		}
	}
	l := selection.Limits{
		MaxConcurrent: p.req.Limits.MaxConcurrent, MaxLifetime: p.req.Limits.MaxLifetime,
		StaggerDrains: p.req.Limits.StaggerDrains, StaleAfter: p.req.StaleAfter, MaxScan: p.req.MaxScan,
	}
	now := info.Now
	var d selection.Decision
	switch p.policy {
	case LifetimeFirst:
		d = selection.LifetimeFirst{Limits: l}.Select(ws, now)
	case FairShare:
		d = selection.FairShare{Limits: l, Window: selection.DefaultWindow, Default: selection.DefaultEstimate}.Select(ws, now)
	case Vnode:
		o := p.req.Options.(VnodeOptions)
		v := selection.Vnode{Limits: l, Samples: o.Samples, SlotJitter: o.SlotJitter}
		if l.StaggerDrains {
			v.Retiring = selection.AnyRetiring(ws, l, now)
		}
		ring := selection.NewRing()
		index := map[string]int{}
		for i := range ws {
			index[ws[i].ID] = i
			if ws[i].Status == selection.Available {
				ring.Add(ws[i].ID, selection.DefaultVirtualNodes)
			}
		}
		lookup := func(id string) (*selection.Worker, bool) {
			i, ok := index[id]
			if !ok {
				return nil, false
			}
			return &ws[i], true
		}
		d = v.Select(ring, lookup, v.Draw(p.draws), now)
	case InterleavedWeightedRoundRobin:
		var cur selection.IWRRCursor
		if c, err := p.ops.rdb.HGet(ctx, p.ops.Key("eq", keyState), " iwrr").Result(); err == nil {
			f := strings.Fields(c)
			cur.Round, _ = strconv.Atoi(f[0])
			cur.Weight, _ = strconv.Atoi(f[1])
			cur.ID = f[2]
		}
		if l.StaggerDrains {
			l.Retiring = selection.AnyRetiring(ws, l, now)
		}
		d, _ = l.NextIWRR(cur, ws, now)
	}
	req := p.req
	c, _, err := p.pick.Pick(ctx, req)
	got := ""
	if err == nil {
		got = c.Worker.ID
	} else if err != ErrNoWorker {
		p.t.Fatalf("%s: pick: %v", where, err)
	}
	want := ""
	if d.OK {
		want = d.ID
	}
	if got != want {
		var b strings.Builder
		for _, w := range ws {
			fmt.Fprintf(&b, "\n  %s %s a=%d l=%d cap=%d w=%d hb=%v sus=%v hold=%v pe=%v d=%v", w.ID, w.Status, w.Active, w.Lifetime,
				w.Capacity, w.Weight, now.Sub(w.LastHeartbeat).Round(time.Second), w.SuspectUntil.After(now), w.Hold,
				w.PredictedEnd.Sub(now).Round(time.Second), len(w.Durations))
		}
		iw, _ := p.ops.rdb.ZRange(ctx, p.ops.Key("eq", keyIdxIWRR), 0, -1).Result()
		cur, _ := p.ops.rdb.HGet(ctx, p.ops.Key("eq", keyState), " iwrr").Result()
		p.t.Fatalf("%s: %s picked %q, selection %q; limits %+v scan %d options %+v; retiring %v; iwrr %v cursor %q%s",
			where, p.policy, got, want, p.req.Limits, p.req.MaxScan, p.req.Options, info.Retiring, iw, cur, b.String())
	}
}

func init() {
	if n, err := strconv.Atoi(os.Getenv("GRID_EQUIVALENCE_TRIALS")); err == nil && n > 0 {
		equivalenceTrials = n
	}
}
