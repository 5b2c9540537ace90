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
)

// TestRedisMemoryPerWorkerAndPerSession measures what the grid keeps in
// Redis per registered worker and per session record, as docs/redis.md
// reports it: used_memory (INFO memory) before and after n signed
// Playwright workers register, after n sessions are claimed (without, then
// with, a client hash and a label), and after every worker, chosen by a
// fair_share claim, has served 20 sessions (each keeps its last 20, fair
// share's default window), with MEMORY USAGE of each key. It prints the figures and asserts none of them: they depend on the
// Redis version and its allocator.
//
//	go test -count=1 -v -run TestRedisMemoryPerWorkerAndPerSession ./registry/
//	GRID_MEMORY_N=10000 go test ... (default 2,000)
func TestRedisMemoryPerWorkerAndPerSession(t *testing.T) {
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("GRID_MEMORY_N")); err == nil && v > 0 {
		n = v
	}
	r, _ := newTestRegistry(t)
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(1, 2))
	const group = "chromium@1.65"
	secret := []byte("memory-test-secret")
	hex := func(k int) string {
		const digits = "0123456789abcdef"
		b := make([]byte, k)
		for i := range b {
			b[i] = digits[rnd.IntN(16)]
		}
		return string(b)
	}

	// The library is loaded and the directory written before the baseline.
	warm := NewRecord(Record{ID: "warm-1", Pool: "warmup", Browser: "chromium", Addr: "10.0.0.1:3131", Path: "/playwright"}, 0, secret)
	if err := r.Register(ctx, warm, AgentState{}, ""); err != nil {
		t.Fatal(err)
	}
	memory := func(field string) int64 {
		t.Helper()
		info, err := r.rdb.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, field+":"); ok {
				x, _ := strconv.ParseInt(v, 10, 64)
				return x
			}
		}
		return -1 // not in this Redis version's INFO
	}
	used := func() int64 { return memory("used_memory") }
	t.Logf("the function library %s: used_memory_vm_functions %d bytes, used_memory_functions %d bytes",
		LibraryName(), memory("used_memory_vm_functions"), memory("used_memory_functions"))
	keyUsage := func(names ...string) string {
		t.Helper()
		var b strings.Builder
		for _, name := range names {
			k := r.Key(group, name)
			u, err := r.rdb.MemoryUsage(ctx, k, 0).Result()
			if err != nil {
				u = 0 // the key does not exist
			}
			fmt.Fprintf(&b, "\n    %-40s %9d bytes, %6.1f per worker or session", k, u, float64(u)/float64(n))
		}
		return b.String()
	}
	per := func(what string, before, after int64) {
		t.Logf("%s: used_memory +%d bytes for %d, %.0f bytes each", what, after-before, n, float64(after-before)/float64(n))
	}

	// Workers: what grid-worker -worker-secret -max-concurrent 2 registers.
	base := used()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("worker-%s-%d-%s", hex(4), 10000+i, hex(8))
		rec := NewRecord(Record{
			ID: ids[i], Pool: "chromium", Version: "1.65", Browser: "chromium",
			Addr: fmt.Sprintf("10.20.%d.%d:3131", i/250, i%250+1), Path: "/playwright",
			Capacity: 2, Launcher: "playwright",
		}, 0, secret)
		if err := r.Register(ctx, rec, AgentState{}, ""); err != nil {
			t.Fatal(err)
		}
	}
	afterWorkers := used()
	per("registered workers (record, state, indexes, 8 ring positions)", base, afterWorkers)
	t.Logf("  MEMORY USAGE:%s", keyUsage(keyWorkers, keyState, keyIdxLF, keyIdxRing, keyIdxIdle, keyIdxIWRR))

	claimAll := func(client bool) []string {
		t.Helper()
		out := make([]string, n)
		for i := range out {
			req := ClaimRequest{
				Group: group, Policy: LifetimeFirst, Session: strings.ToLower(hex(26)),
				Instance: "caddy-1-4242-" + hex(6), StaleAfter: time.Minute,
			}
			if client {
				req.Client, req.ClientLimit, req.Label = hex(24), n, "checkout.spec.ts:42"
			}
			c, _, err := r.Claim(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			out[i] = c.Session
		}
		return out
	}
	endAll := func(sessions []string) {
		t.Helper()
		// lifetime_first without limits gives them all to one worker
		byWorker := map[string][]Ended{}
		all, _, err := r.Sessions(ctx, group, 0, 10*n)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]bool{}
		for _, s := range sessions {
			want[s] = true
		}
		for _, s := range all {
			if want[s.ID] {
				byWorker[s.Worker] = append(byWorker[s.Worker], Ended{Session: s.ID, Duration: time.Duration(5000+rnd.IntN(55000)) * time.Millisecond})
			}
		}
		for w, es := range byWorker {
			for len(es) > 0 {
				k := min(len(es), 500)
				if _, err := r.EndServed(ctx, group, w, es[:k]); err != nil {
					t.Fatal(err)
				}
				es = es[k:]
			}
		}
	}

	// Session records: pending and live ones are the same size.
	before := used()
	plain := claimAll(false)
	afterPlain := used()
	per("session records, no client_limit, no Grid-Label", before, afterPlain)
	t.Logf("  MEMORY USAGE:%s", keyUsage(keySessions, keySIndex))
	endAll(plain)

	before = used()
	full := claimAll(true)
	afterFull := used()
	per("session records with a client hash (client_limit) and a 19-character Grid-Label", before, afterFull)
	t.Logf("  MEMORY USAGE:%s", keyUsage(keySessions, keySIndex))
	endAll(full)

	// A fair-share worker's last 20 durations (the default window): one
	// fair_share claim chooses each worker in turn, then its sessions end.
	fair := make([]string, len(ids))
	for i := range ids {
		fair[i] = strings.ToLower(hex(26))
		c, _, err := r.Claim(ctx, ClaimRequest{Group: group, Policy: FairShare, Options: FairShareOptions{Window: 20},
			Session: fair[i], StaleAfter: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.GiveBack(ctx, group, c.Worker.ID, false, 0, fair[i]); err != nil {
			t.Fatal(err)
		}
	}
	afterEnds := used()
	for _, id := range ids {
		live := make([]string, 20)
		ends := make([]Ended, 20)
		for j := range live {
			live[j] = strings.ToLower(hex(26))
			ends[j] = Ended{Session: live[j], Duration: time.Duration(5000+rnd.IntN(55000)) * time.Millisecond}
		}
		if _, err := r.Heartbeat(ctx, group, id, AgentState{Lifetime: 20, Sessions: live}); err != nil {
			t.Fatal(err)
		}
		if _, err := r.EndServed(ctx, group, id, ends); err != nil {
			t.Fatal(err)
		}
	}
	afterHistory := used()
	per("a fair-share worker's 20 session durations", afterEnds, afterHistory)
	per("a fair-share worker that has served 20 sessions or more, in all", base, afterHistory)
	t.Logf("  MEMORY USAGE:%s", keyUsage(keyWorkers, keyState, keyIdxLF, keyIdxRing, keyIdxIdle, keyIdxIWRR, keySessions, keySIndex))
}
