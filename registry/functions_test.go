package registry

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// hasLibrary reports whether the server c talks to has library name.
func hasLibrary(t *testing.T, c *redis.Client, name string) bool {
	t.Helper()
	libs, err := c.FunctionList(context.Background(), redis.FunctionListQuery{LibraryNamePattern: name}).Result()
	if err != nil {
		t.Fatalf("FUNCTION LIST on %s: %v", c.Options().Addr, err)
	}
	for _, l := range libs {
		if l.Name == name {
			return true
		}
	}
	return false
}

// useGrid registers a worker in pool, claims, picks, inspects and
// releases: every kind of call (FCALL and FCALL_RO) once.
func useGrid(t *testing.T, r *Registry, pool string) {
	t.Helper()
	ctx := context.Background()
	if err := r.Register(ctx, Registration{Pool: pool, ID: "w1", Addr: "h:1", Path: "/", Capacity: 4, TTL: time.Minute}); err != nil {
		t.Fatalf("%s: register: %v", pool, err)
	}
	if _, _, err := r.Pick(ctx, ClaimRequest{Pool: pool, Policy: LifetimeFirst}); err != nil {
		t.Fatalf("%s: pick: %v", pool, err)
	}
	c, err := r.Claim(ctx, ClaimRequest{Pool: pool, Policy: LifetimeFirst})
	if err != nil {
		t.Fatalf("%s: claim: %v", pool, err)
	}
	if _, err := r.Inspect(ctx, pool); err != nil {
		t.Fatalf("%s: inspect: %v", pool, err)
	}
	if err := r.Release(ctx, pool, c.LeaseID); err != nil {
		t.Fatalf("%s: release: %v", pool, err)
	}
}

// heldOut reports whether err is a claim's NoWorkerError for a pool held
// after its data came back on another server process (NoWorkerError.Held),
// once the hold is over.
func heldOut(err error) bool {
	var nw *NoWorkerError
	if !errors.As(err, &nw) || nw.Held <= 0 {
		return false
	}
	time.Sleep(nw.Held)
	return true
}

// FUNCTION FLUSH under a running grid: the next call of each kind finds
// its function missing, loads the library and runs.
func TestFunctionFlushReloads(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	c := rdb.(*redis.Client)
	if hasLibrary(t, c, LibraryName()) {
		t.Fatal("a fresh Redis has the library before any call")
	}
	useGrid(t, r, "p")
	if !hasLibrary(t, c, LibraryName()) {
		t.Fatalf("library %s not loaded by the first call", LibraryName())
	}
	c1, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst})
	if err != nil {
		t.Fatal(err)
	}
	// Each kind of call first after a flush: a read-only one, a claim, a
	// release.
	for _, call := range []struct {
		what string
		run  func() error
	}{
		{"pick (FCALL_RO)", func() error { _, _, err := r.Pick(ctx, ClaimRequest{Pool: "p", Policy: Vnode}); return err }},
		{"claim", func() error { _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: FairShare}); return err }},
		{"release", func() error { return r.Release(ctx, "p", c1.LeaseID) }},
		{"heartbeat", func() error { _, err := r.Heartbeat(ctx, "p", "w1", time.Minute); return err }},
	} {
		if err := c.FunctionFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := call.run(); err != nil {
			t.Fatalf("%s after FUNCTION FLUSH: %v", call.what, err)
		}
		if !hasLibrary(t, c, LibraryName()) {
			t.Fatalf("%s after FUNCTION FLUSH did not load the library", call.what)
		}
	}
	if got := counts(t, r, "p")["w1"]; got != [2]int{1, 3} {
		t.Fatalf("w1 (active, lifetime) = %v, want [1 3]: a reloaded call ran twice or not at all", got)
	}
}

// A Redis restarted empty (no persistence: data and functions gone): the
// agent registers again and claims are served, loading the library anew.
func TestRedisRestartedEmpty(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	r, _ := registryAt(t, srv.URL(), Options{})
	useGrid(t, r, "p")
	srv.Restart()
	if hasLibrary(t, srv.Client(), LibraryName()) {
		t.Fatal("the restarted Redis still has the library: it did not start empty")
	}
	// The first call after the restart is a heartbeat: the worker is gone.
	testenv.Eventually(t, 10*time.Second, "a heartbeat answered by the restarted Redis", func() bool {
		_, err := r.Heartbeat(ctx, "p", "w1", time.Minute)
		return err == nil || errors.Is(err, ErrNotRegistered)
	})
	useGrid(t, r, "p")
}

// On a real Cluster, the first call that finds the library missing loads
// it on every master; a master that loses it later (restarted empty,
// flushed) loads it again at the first call for one of its slots.
func TestClusterLoadsOnEachMaster(t *testing.T) {
	ctx := context.Background()
	cl := testenv.StartCluster(t)
	r, _ := registryAt(t, cl.URL(), Options{})
	// One pool per master.
	pools := map[string]string{} // master addr -> pool
	var first string
	for i := 0; len(pools) < len(cl.Addrs) && i < 1000; i++ {
		pool := "p" + strconv.Itoa(i)
		m := cl.MasterOf(cl.Slot(r.Key(pool, keyWorkers)))
		if _, ok := pools[m.Addr]; !ok {
			pools[m.Addr] = pool
			first = pool
		}
	}
	if len(pools) != len(cl.Addrs) {
		t.Fatalf("pools on %d masters, want %d", len(pools), len(cl.Addrs))
	}
	for addr := range pools {
		if hasLibrary(t, cl.Node(addr).Client(), LibraryName()) {
			t.Fatalf("master %s has the library before any call", addr)
		}
	}
	useGrid(t, r, first)
	for addr := range pools {
		if !hasLibrary(t, cl.Node(addr).Client(), LibraryName()) {
			t.Fatalf("master %s did not get the library at the first miss", addr)
		}
	}
	for addr, pool := range pools {
		c := cl.Node(addr).Client()
		if err := c.FunctionFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		useGrid(t, r, pool)
		if !hasLibrary(t, c, LibraryName()) {
			t.Fatalf("master %s of pool %s did not load the library again", addr, pool)
		}
	}
}

// A Sentinel failover to a replica that never had the library (its copy
// was flushed): the first claim on the new master loads it.
func TestSentinelFailoverToReplicaWithoutLibrary(t *testing.T) {
	ctx := context.Background()
	s := testenv.StartSentinel(t, 1)
	r, _ := registryAt(t, s.URL(), Options{})
	useGrid(t, r, "p")
	s.WaitInSync(10 * time.Second)
	replica := s.Servers[1].Client()
	if !hasLibrary(t, replica, LibraryName()) {
		t.Fatal("the replica did not get the library by replication")
	}
	// Make the replica lose it (a replica refuses FUNCTION FLUSH while
	// read-only).
	for _, cmd := range [][]any{{"CONFIG", "SET", "replica-read-only", "no"}, {"FUNCTION", "FLUSH"}, {"CONFIG", "SET", "replica-read-only", "yes"}} {
		if err := replica.Do(ctx, cmd...).Err(); err != nil {
			t.Fatalf("%v on the replica: %v", cmd, err)
		}
	}
	old := s.Master()
	old.Kill()
	promoted := s.WaitFailover(old, 60*time.Second)
	if hasLibrary(t, promoted.Client(), LibraryName()) {
		t.Fatal("the promoted replica has the library: the test does not cover a missing one")
	}
	testenv.Eventually(t, 30*time.Second, "a claim on the promoted replica", func() bool {
		_, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst})
		return err == nil
	})
	if !hasLibrary(t, promoted.Client(), LibraryName()) {
		t.Fatal("the claim did not load the library on the new master")
	}
	useGrid(t, r, "p")
}

// Reads run with FCALL_RO on a read-only replica. A replica cannot load a
// library: while its master has none, a read fails saying so; once a
// write through the master loaded it, the replica has it by replication.
func TestReadOnlyReplicaFunctions(t *testing.T) {
	ctx := context.Background()
	master := testenv.StartRedis(t)
	replica := testenv.StartRedis(t, "--replicaof", "127.0.0.1", strings.Split(master.Addr, ":")[1])
	mc, err := NewClient(master.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mc.Close() })
	rc, err := NewClient(replica.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	ro := New(rc, Options{})
	testenv.Eventually(t, 30*time.Second, "the replica in sync", func() bool {
		info, err := replica.Client().Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	_, err = ro.Inspect(ctx, "p")
	if err == nil || !strings.Contains(err.Error(), "read-only replica") || !strings.Contains(err.Error(), LibraryName()) {
		t.Fatalf("a read on a replica without the library: %v, want an error naming the library and the replica", err)
	}
	useGrid(t, New(mc, Options{}), "p")
	testenv.Eventually(t, 30*time.Second, "the library on the replica", func() bool {
		return hasLibrary(t, replica.Client(), LibraryName())
	})
	if _, _, err := ro.Pick(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst}); err != nil {
		t.Fatalf("pick on the replica: %v", err)
	}
	info, err := ro.Inspect(ctx, "p")
	if err != nil || len(info.Workers) != 1 {
		t.Fatalf("inspect on the replica: %+v %v", info, err)
	}
	if err := ro.Register(ctx, Registration{Pool: "p", ID: "w2", Addr: "h:2", Path: "/", TTL: time.Minute}); err == nil ||
		!strings.Contains(err.Error(), "READONLY") {
		t.Fatalf("a write on the replica: %v, want READONLY", err)
	}
}

// Two versions of the registry (a rolling upgrade) on one Redis: each
// calls its own library, both stay loaded and both answer.
func TestTwoLibraryVersionsCoexist(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	c := rdb.(*redis.Client)
	useGrid(t, r, "p")
	// Another version: the same scripts, one more (its source, so its
	// hash and names, differ).
	other := newLibrary(append(append([]libScript(nil), registryScripts...), libScript{name: "version", body: "return 'other'"}))
	if other.name == registryLib.name {
		t.Fatalf("two different sources got one library name %s", other.name)
	}
	if got, err := r.run(ctx, other.function("version"), "p", 0).Text(); err != nil || got != "other" {
		t.Fatalf("the other version's own function: %q %v", got, err)
	}
	res, err := r.runRO(ctx, other.function("read"), "p", 0, "", "0", 10).Slice()
	if err != nil || len(res) != len(readReply) {
		t.Fatalf("the other version's read: %v %v", res, err)
	}
	for _, name := range []string{registryLib.name, other.name} {
		if !hasLibrary(t, c, name) {
			t.Fatalf("library %s not loaded", name)
		}
	}
	useGrid(t, r, "p")
}

// Every script's function stays below Lua 5.1's 60 upvalues (each common
// helper a body uses is one; FUNCTION LOAD fails past 60). The headroom is
// measured, not estimated: the most extra library locals a body can also
// use and still load.
func TestFunctionUpvalueHeadroom(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	c := srv.Client()
	loads := func(s libScript, extra int) bool {
		if extra > 0 {
			names := make([]string, extra)
			for i := range names {
				names[i] = "u" + strconv.Itoa(i)
			}
			list := strings.Join(names, ", ")
			s.prologue += "\nlocal " + list + "\n"
			s.body = "local _ = {" + list + "}\n" + s.body
		}
		err := c.FunctionLoad(ctx, newLibrary([]libScript{s}).source).Err()
		if err != nil && !strings.Contains(err.Error(), "upvalues") {
			t.Fatalf("%s with %d extra upvalues: %v", s.name, extra, err)
		}
		return err == nil
	}
	for _, s := range append(append([]libScript(nil), registryScripts...), libScript{name: "put", body: luaPut}) {
		if !loads(s, 0) {
			t.Fatalf("%s does not load: more than 60 upvalues", s.name)
		}
		lo, hi := 0, 61 // loads with lo extra, not with hi
		for hi-lo > 1 {
			mid := (lo + hi) / 2
			if loads(s, mid) {
				lo = mid
			} else {
				hi = mid
			}
		}
		t.Logf("%s: %d upvalues, headroom %d", s.name, 60-lo, lo)
	}
}

// A master added to a running Cluster, given a slot the grid already
// uses: the client's slot map still names the old owner, which answers
// MOVED; the new node never had the library, and loads it at the first
// call that reaches it.
func TestClusterNodeAddedLater(t *testing.T) {
	ctx := context.Background()
	cl := testenv.StartCluster(t)
	r, _ := registryAt(t, cl.URL(), Options{})
	// A pool of its own, on a slot no other test key shares, used once so
	// the client's map and the old owner know it.
	const pool = "moving"
	slot := cl.Slot(r.Key(pool, keyWorkers))
	useGrid(t, r, pool)
	src := cl.MasterOf(slot)
	// The new node: an empty master that joins the cluster.
	dst := testenv.StartRedis(t, "--cluster-enabled", "yes")
	dc := dst.Client()
	host, port, _ := strings.Cut(src.Addr, ":")
	if err := dc.ClusterMeet(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	dstID, err := dc.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	srcID, err := src.Client().Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "every node to know the new one", func() bool {
		for _, n := range append(cl.Nodes, dst) {
			nodes, err := n.Client().ClusterNodes(ctx).Result()
			if err != nil || !strings.Contains(nodes, dstID) || !strings.Contains(nodes, srcID) {
				return false
			}
		}
		info, err := dc.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok")
	})
	// Move the slot with its keys (redis-cli --cluster reshard's steps).
	must := func(c *redis.Client, args ...any) {
		t.Helper()
		if err := c.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%v on %s: %v", args, c.Options().Addr, err)
		}
	}
	must(dc, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID)
	must(src.Client(), "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID)
	dhost, dport, _ := strings.Cut(dst.Addr, ":")
	for {
		keys, err := src.Client().ClusterGetKeysInSlot(ctx, slot, 100).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", dhost, dport, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		must(src.Client(), args...)
	}
	for _, n := range append(cl.Nodes, dst) {
		must(n.Client(), "CLUSTER", "SETSLOT", slot, "NODE", dstID)
	}
	if hasLibrary(t, dc, LibraryName()) {
		t.Fatal("the new node has the library before any call")
	}
	// The first claim after the move: MOVED by the old owner, then the new
	// node, which loads the library. The pool is on another server process
	// now, which a claim cannot tell from a restore: it is held a moment.
	if _, err := r.Claim(ctx, ClaimRequest{Pool: pool, Policy: LifetimeFirst}); err != nil && !heldOut(err) {
		t.Fatalf("the first claim on the added node: %v", err)
	}
	if !hasLibrary(t, dc, LibraryName()) {
		t.Fatal("the claim did not load the library on the added node")
	}
	useGrid(t, r, pool)
}
