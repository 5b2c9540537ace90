package main

// The memory section: what the grid keeps in Redis per registered worker
// and per session record (docs/redis.md, "Memory"). On a private
// redis-server, used_memory (INFO memory) before and after N signed
// Playwright workers register (what grid-worker -worker-secret
// -max-concurrent 2 writes), after N sessions are claimed (without, then
// with, a client hash and a label), and after every worker, chosen once by
// a fair_share claim, has served 20 sessions (it keeps the last 20,
// fair share's default window).
//
//	gridbench -only memory          # N = 2,000 and 10,000
//	gridbench -only memory -quick   # N = 200

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

func init() {
	register(section{name: "memory", order: 70, run: runMemory})
}

func runMemory(cfg *config) error {
	sizes := []int{2000, 10000}
	if cfg.quick {
		sizes = []int{200}
	}
	var rows [][]string
	fn := ""
	for _, n := range sizes {
		m, err := measureMemory(n)
		if err != nil {
			return err
		}
		fn = m.functions
		for i, x := range m.each {
			if len(rows) <= i {
				rows = append(rows, []string{x.what})
			}
			rows[i] = append(rows[i], strconv.FormatInt(x.bytes, 10))
		}
	}
	head := []string{"what (used_memory delta / N)"}
	for _, n := range sizes {
		head = append(head, fmt.Sprintf("bytes each, N = %s", count(n)))
	}
	fmt.Fprintf(cfg.out, "Private redis-server; workers signed, -max-concurrent 2, 8 ring positions; session IDs of 26 characters.\n\n")
	table(cfg.out, head, rows...)
	fmt.Fprintf(cfg.out, "\nThe function library: %s.\n", fn)
	return nil
}

type memoryFigures struct {
	functions string
	each      []struct {
		what  string
		bytes int64
	}
}

func measureMemory(n int) (*memoryFigures, error) {
	w, err := newWorld()
	if err != nil {
		return nil, err
	}
	defer w.close()
	ctx := context.Background()
	reg, rdb := w.reg, w.rdb
	rnd := rand.New(rand.NewPCG(1, 2))
	const group = "chromium@1.65"
	secret := []byte("gridbench-memory-secret")
	hex := func(k int) string {
		const digits = "0123456789abcdef"
		b := make([]byte, k)
		for i := range b {
			b[i] = digits[rnd.IntN(16)]
		}
		return string(b)
	}
	memory := func(field string) int64 {
		info, _ := rdb.Info(ctx, "memory").Result()
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, field+":"); ok {
				x, _ := strconv.ParseInt(v, 10, 64)
				return x
			}
		}
		return -1
	}
	used := func() int64 { return memory("used_memory") }
	out := &memoryFigures{}
	add := func(what string, before, after int64) {
		out.each = append(out.each, struct {
			what  string
			bytes int64
		}{what, (after - before) / int64(n)})
	}

	// The library is loaded and the directory written before the baseline.
	warm := registry.NewRecord(registry.Record{ID: "warm-1", Pool: "warmup", Browser: "chromium", Addr: "10.0.0.1:3131", Path: "/playwright"}, 0, secret)
	if err := reg.Register(ctx, warm, registry.AgentState{}, ""); err != nil {
		return nil, err
	}
	out.functions = fmt.Sprintf("used_memory_vm_functions %d bytes, used_memory_functions %d bytes",
		memory("used_memory_vm_functions"), memory("used_memory_functions"))

	base := used()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("worker-%s-%d-%s", hex(4), 10000+i, hex(8))
		rec := registry.NewRecord(registry.Record{
			ID: ids[i], Pool: "chromium", Version: "1.65", Browser: "chromium",
			Addr: fmt.Sprintf("10.20.%d.%d:3131", i/250, i%250+1), Path: "/playwright",
			Capacity: 2, Launcher: "playwright",
		}, 0, secret)
		if err := reg.Register(ctx, rec, registry.AgentState{}, ""); err != nil {
			return nil, err
		}
	}
	afterWorkers := used()
	add("a registered worker: record, state, indexes, 8 ring positions", base, afterWorkers)

	claimAll := func(client bool) ([]registry.Claim, error) {
		out := make([]registry.Claim, n)
		for i := range out {
			req := registry.ClaimRequest{
				Group: group, Policy: registry.LifetimeFirst, Session: strings.ToLower(hex(26)),
				Instance: "caddy-1-4242-" + hex(6), StaleAfter: time.Minute,
			}
			if client {
				req.Client, req.ClientLimit, req.Label = hex(24), n, "checkout.spec.ts:42"
			}
			c, _, err := reg.Claim(ctx, req)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	}
	endAll := func(cs []registry.Claim) error {
		byWorker := map[string][]registry.Ended{}
		for _, c := range cs {
			byWorker[c.Worker.ID] = append(byWorker[c.Worker.ID], registry.Ended{Session: c.Session, Duration: time.Second})
		}
		for wid, es := range byWorker {
			for len(es) > 0 {
				k := min(len(es), 500)
				if _, err := reg.GiveBack(ctx, group, wid, false, 0, sessionIDs(es[:k])...); err != nil {
					return err
				}
				es = es[k:]
			}
		}
		return nil
	}

	before := used()
	plain, err := claimAll(false)
	if err != nil {
		return nil, err
	}
	add("a session record, no client_limit, no Grid-Label", before, used())
	if err := endAll(plain); err != nil {
		return nil, err
	}
	before = used()
	full, err := claimAll(true)
	if err != nil {
		return nil, err
	}
	add("a session record with a client hash and a 19-character Grid-Label", before, used())
	if err := endAll(full); err != nil {
		return nil, err
	}

	// One fair_share claim chooses each worker in turn; then each serves
	// 20 sessions.
	for range ids {
		sid := strings.ToLower(hex(26))
		c, _, err := reg.Claim(ctx, registry.ClaimRequest{Group: group, Policy: registry.FairShare,
			Options: registry.FairShareOptions{Window: 20}, Session: sid, StaleAfter: time.Hour})
		if err != nil {
			return nil, err
		}
		if _, err := reg.GiveBack(ctx, group, c.Worker.ID, false, 0, sid); err != nil {
			return nil, err
		}
	}
	beforeHistory := used()
	for _, id := range ids {
		live := make([]registry.LiveSession, 20)
		ends := make([]registry.Ended, 20)
		for j := range live {
			live[j].ID = strings.ToLower(hex(26))
			ends[j] = registry.Ended{Session: live[j].ID, Duration: time.Duration(5000+rnd.IntN(55000)) * time.Millisecond}
		}
		if _, err := reg.Heartbeat(ctx, group, id, registry.AgentState{Lifetime: 20, Sessions: live}); err != nil {
			return nil, err
		}
		if _, err := reg.EndServed(ctx, group, id, ends); err != nil {
			return nil, err
		}
	}
	add("a fair_share worker's last 20 session durations", beforeHistory, used())
	return out, nil
}

func sessionIDs(es []registry.Ended) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.Session
	}
	return out
}
