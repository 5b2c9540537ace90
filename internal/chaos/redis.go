package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisNode is one redis-server of a scenario, with its data in its own
// dir and no persistence: a restart comes back empty.
type redisNode struct {
	name string
	port int
	dir  string
	args []string
	p    *proc
}

func (n *redisNode) addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }

// startRedisNode starts redis-server on a free port; extra are more
// redis-server options.
func (e *env) startRedisNode(name string, extra ...string) (*redisNode, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	n := &redisNode{name: name, port: port, dir: filepath.Join(e.dir, name)}
	if err := os.MkdirAll(n.dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", n.dir, err)
	}
	n.args = append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", n.dir,
		"--save", "", "--appendonly", "no", "--protected-mode", "no", "--loglevel", "warning",
	}, extra...)
	return n, n.start(e)
}

func (n *redisNode) start(e *env) error {
	p, err := e.procs.start(n.name, nil, "redis-server", n.args...)
	if err != nil {
		return err
	}
	n.p = p
	if err := waitTCP(n.addr(), p, 10*time.Second); err != nil {
		return fmt.Errorf("redis-server %s did not start: %w", n.name, err)
	}
	return nil
}

// cli runs redis-cli against the node and returns its output.
func (n *redisNode) cli(args ...string) (string, error) { return n.cliWithin(5*time.Second, args...) }

// cliWithin is cli with its own deadline (DEBUG SLEEP outlasts cli's).
func (n *redisNode) cliWithin(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "redis-cli", append([]string{"-p", strconv.Itoa(n.port)}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("redis-cli -p %d %s: %w: %s", n.port, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// topology is the Redis a scenario's grid runs on: a single node, a
// Cluster with replicas, or a Sentinel-managed master and replica.
type topology struct {
	// url is what Caddy and the agents are given.
	url string
	// rdb is the harness's own client, with deadlines that hold (500 ms),
	// so a stalled or dead Redis never stalls the sampler.
	rdb   redis.UniversalClient
	nodes []*redisNode
	// sentinels and master name, for a Sentinel topology.
	sentinels  []*redisNode
	masterName string
}

// harnessTimeouts are the harness client's deadlines.
func harnessTimeouts() (dial, rw time.Duration) {
	return 500 * time.Millisecond, 700 * time.Millisecond
}

// startSingle starts one redis-server. debug enables DEBUG (for DEBUG SLEEP).
func (e *env) startSingle(debug bool) (*topology, error) {
	var extra []string
	if debug {
		extra = append(extra, "--enable-debug-command", "yes")
	}
	n, err := e.startRedisNode("redis", extra...)
	if err != nil {
		return nil, err
	}
	dial, rw := harnessTimeouts()
	rdb := redis.NewClient(&redis.Options{
		Addr: n.addr(), DialTimeout: dial, ReadTimeout: rw, WriteTimeout: rw,
		ContextTimeoutEnabled: true, MaxRetries: -1,
	})
	return &topology{url: "redis://" + n.addr() + "/0", rdb: rdb, nodes: []*redisNode{n}}, nil
}

// startCluster starts six cluster-enabled nodes, joins them as three
// masters with one replica each, and waits until the cluster is ok on
// every node and every replica's link to its master is up and synced.
func (e *env) startCluster() (*topology, error) {
	t := &topology{}
	var addrs []string
	for i := range 6 {
		n, err := e.startRedisNode(fmt.Sprintf("cluster-%d", i+1),
			"--cluster-enabled", "yes", "--cluster-node-timeout", "2000",
			"--cluster-config-file", "nodes.conf")
		if err != nil {
			return nil, err
		}
		t.nodes = append(t.nodes, n)
		addrs = append(addrs, n.addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	for _, n := range t.nodes {
		err := poll(30*time.Second, 100*time.Millisecond, "cluster_state:ok on "+n.addr(), func() (bool, error) {
			info, err := n.cli("cluster", "info")
			return err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:6"), err
		})
		if err != nil {
			return nil, err
		}
	}
	if err := t.waitReplicasInSync(); err != nil {
		return nil, err
	}
	dial, rw := harnessTimeouts()
	t.rdb = redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: addrs, DialTimeout: dial, ReadTimeout: rw, WriteTimeout: rw,
		ContextTimeoutEnabled: true, MaxRetries: 1,
	})
	t.url = "redis+cluster://" + strings.Join(addrs, ",")
	return t, nil
}

// waitReplicasInSync waits until three nodes are replicas whose link to
// their master is up and not syncing.
func (t *topology) waitReplicasInSync() error {
	return poll(30*time.Second, 100*time.Millisecond, "three replicas in sync", func() (bool, error) {
		synced := 0
		for _, n := range t.nodes {
			if n.p.exited() {
				continue
			}
			info, err := n.cli("info", "replication")
			if err != nil {
				return false, err
			}
			if strings.Contains(info, "role:slave") && strings.Contains(info, "master_link_status:up") &&
				strings.Contains(info, "master_sync_in_progress:0") {
				synced++
			}
		}
		return synced == 3, fmt.Errorf("%d of 3 replicas in sync", synced)
	})
}

// slotOwner returns the master node serving key's slot and its replica.
func (t *topology) slotOwner(key string) (master, replica *redisNode, err error) {
	out, err := t.nodes[0].cli("cluster", "keyslot", key)
	if err != nil {
		return nil, nil, err
	}
	slot, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the slot of %q: %q", key, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: t.nodes[0].addr()})
	defer c.Close()
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("reading CLUSTER SLOTS: %w", err)
	}
	byAddr := map[string]*redisNode{}
	for _, n := range t.nodes {
		byAddr[n.addr()] = n
	}
	for _, s := range slots {
		if slot < s.Start || slot > s.End || len(s.Nodes) < 2 {
			continue
		}
		return byAddr[s.Nodes[0].Addr], byAddr[s.Nodes[1].Addr], nil
	}
	return nil, nil, fmt.Errorf("no master with a replica serves slot %d", slot)
}

// sentinelMaster is the name Sentinel monitors the grid's master under.
const sentinelMaster = "gridmaster"

// startSentinel starts a master, a replica and three sentinels (quorum
// 2, down after 1 s), and waits until every sentinel knows the replica
// and the other two sentinels.
func (e *env) startSentinel() (*topology, error) {
	m, err := e.startRedisNode("sentinel-master")
	if err != nil {
		return nil, err
	}
	r, err := e.startRedisNode("sentinel-replica", "--replicaof", "127.0.0.1", strconv.Itoa(m.port))
	if err != nil {
		return nil, err
	}
	t := &topology{nodes: []*redisNode{m, r}, masterName: sentinelMaster}
	var addrs []string
	for i := range 3 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		name := fmt.Sprintf("sentinel-%d", i+1)
		dir := filepath.Join(e.dir, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nprotected-mode no\n"+
			"sentinel monitor %s 127.0.0.1 %d 2\n"+
			"sentinel down-after-milliseconds %[3]s 1000\n"+
			"sentinel failover-timeout %[3]s 5000\n"+
			"sentinel parallel-syncs %[3]s 1\n", port, dir, sentinelMaster, m.port)
		if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
			return nil, err
		}
		s := &redisNode{name: name, port: port, dir: dir, args: []string{conf, "--sentinel"}}
		if err := s.start(e); err != nil {
			return nil, err
		}
		t.sentinels = append(t.sentinels, s)
		addrs = append(addrs, s.addr())
	}
	for _, s := range t.sentinels {
		err := poll(30*time.Second, 200*time.Millisecond, "sentinel "+s.addr()+" to know the replica and its peers", func() (bool, error) {
			info, err := s.cli("sentinel", "master", sentinelMaster)
			if err != nil {
				return false, err
			}
			fields := strings.Fields(info)
			get := func(k string) string {
				for i := 0; i+1 < len(fields); i++ {
					if fields[i] == k {
						return fields[i+1]
					}
				}
				return ""
			}
			return get("num-slaves") == "1" && get("num-other-sentinels") == "2", fmt.Errorf("num-slaves %s, num-other-sentinels %s", get("num-slaves"), get("num-other-sentinels"))
		})
		if err != nil {
			return nil, err
		}
	}
	dial, rw := harnessTimeouts()
	t.rdb = redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: sentinelMaster, SentinelAddrs: addrs,
		DialTimeout: dial, ReadTimeout: rw, WriteTimeout: rw, ContextTimeoutEnabled: true, MaxRetries: 1,
	})
	t.url = sentinelURL(sentinelMaster, addrs)
	return t, nil
}

// sentinelURL is the form issue 9 specifies for Redis Sentinel:
// redis+sentinel://master-name@h1:p1,h2:p2/db.
func sentinelURL(master string, addrs []string) string {
	return "redis+sentinel://" + master + "@" + strings.Join(addrs, ",") + "/0"
}

// isMaster reports whether a node answers ROLE with master.
func (n *redisNode) isMaster() bool {
	out, err := n.cli("role")
	return err == nil && strings.HasPrefix(strings.TrimSpace(out), "master")
}
