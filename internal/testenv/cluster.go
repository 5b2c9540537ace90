package testenv

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterNodeTimeout is the cluster-node-timeout of the nodes StartCluster
// starts: a master that stops answering is failed over after about this
// long plus an election (Redis: a replica waits 500 ms plus up to 500 ms
// and 1 s per rank before it asks for votes).
const ClusterNodeTimeout = 2 * time.Second

// Cluster is a Redis Cluster started for one test: three masters, each
// with the same number of replicas.
type Cluster struct {
	// Addrs are the nodes' host:port, the three first masters first.
	Addrs []string
	// Nodes are the nodes in the order of Addrs.
	Nodes []*Redis
	t     testing.TB
}

// URL is the redis+cluster:// URL of the cluster (registry.NewClient reads
// it); it names every node, so a client still finds the cluster when some
// are down.
func (c *Cluster) URL() string { return "redis+cluster://" + strings.Join(c.Addrs, ",") }

// StartCluster starts three masters without replicas (see
// StartClusterReplicas).
func StartCluster(t testing.TB) *Cluster { return StartClusterReplicas(t, 0) }

// StartClusterReplicas starts 3 × (1 + replicas) redis-server nodes with
// --cluster-enabled on free ports (cluster-node-timeout
// ClusterNodeTimeout), each in its own temp dir, joins them with
// `redis-cli --cluster create ... --cluster-replicas N`, and returns once
// every node reports cluster_state:ok, knows every other node, and every
// replica is in sync with its master. The nodes stop when the test ends.
func StartClusterReplicas(t testing.TB, replicas int) *Cluster {
	t.Helper()
	cli := LookPath(t, "redis-cli")
	c := &Cluster{t: t}
	n := 3 * (1 + replicas)
	for range n {
		// nodes.conf lands in the node's own temp dir (its --dir).
		node := StartRedis(t, "--cluster-enabled", "yes",
			"--cluster-node-timeout", strconv.Itoa(int(ClusterNodeTimeout/time.Millisecond)))
		c.Nodes = append(c.Nodes, node)
		c.Addrs = append(c.Addrs, node.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	want := "cluster_known_nodes:" + strconv.Itoa(n)
	for _, node := range c.Nodes {
		Eventually(t, 30*time.Second, "cluster node "+node.Addr+" ready", func() bool {
			info, err := node.Client().ClusterInfo(context.Background()).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, want)
		})
	}
	if replicas > 0 {
		Eventually(t, 30*time.Second, "every node to see every replica", func() bool {
			for _, node := range c.Nodes {
				nodes, err := node.Client().ClusterNodes(context.Background()).Result()
				if err != nil || strings.Count(nodes, "slave") != 3*replicas {
					return false
				}
			}
			return true
		})
		c.WaitInSync(30 * time.Second)
	}
	return c
}

// Node is the node at addr, or nil.
func (c *Cluster) Node(addr string) *Redis {
	for _, n := range c.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// anyLive returns a running node's client.
func (c *Cluster) anyLive() *redis.Client {
	for _, n := range c.Nodes {
		if n.Running() {
			return n.Client()
		}
	}
	c.t.Fatal("no cluster node is running")
	return nil
}

// Slot is the hash slot of key (CLUSTER KEYSLOT).
func (c *Cluster) Slot(key string) int {
	c.t.Helper()
	s, err := c.anyLive().ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		c.t.Fatalf("CLUSTER KEYSLOT %s: %v", key, err)
	}
	return int(s)
}

// MasterOf is the node that owns slot as seen by a running node (with the
// given exception, so that a dead master's own view is never asked), or
// nil while no running node knows one.
func (c *Cluster) MasterOf(slot int, except ...*Redis) *Redis {
	for _, n := range c.Nodes {
		if !n.Running() || contains(except, n) {
			continue
		}
		slots, err := n.Client().ClusterSlots(context.Background()).Result()
		if err != nil {
			continue
		}
		for _, s := range slots {
			if s.Start <= slot && slot <= s.End && len(s.Nodes) > 0 {
				return c.Node(s.Nodes[0].Addr)
			}
		}
	}
	return nil
}

// ReplicasOf are the nodes that replicate master (INFO replication of
// each running node).
func (c *Cluster) ReplicasOf(master *Redis) []*Redis {
	var out []*Redis
	for _, n := range c.Nodes {
		if n == master || !n.Running() {
			continue
		}
		info := replicationInfo(n)
		if info["role"] == "slave" && info["master_host"]+":"+info["master_port"] == master.Addr {
			out = append(out, n)
		}
	}
	return out
}

// WaitInSync waits until every running replica's link to its master is up
// and it has applied everything its master had written when the wait
// began (master_repl_offset), so that a failover loses nothing written
// before the call.
func (c *Cluster) WaitInSync(timeout time.Duration) {
	c.t.Helper()
	waitInSync(c.t, c.Nodes, timeout)
}

// WaitPromoted waits until a running node other than old reports that a
// replica took over slot, and that node says it is a master; it returns
// the new master.
func (c *Cluster) WaitPromoted(slot int, old *Redis, timeout time.Duration) *Redis {
	c.t.Helper()
	var m *Redis
	Eventually(c.t, timeout, fmt.Sprintf("a new master for slot %d (was %s)", slot, old.Addr), func() bool {
		m = c.MasterOf(slot, old)
		return m != nil && m != old && m.Running() && replicationInfo(m)["role"] == "master"
	})
	return m
}

func contains(list []*Redis, r *Redis) bool {
	for _, x := range list {
		if x == r {
			return true
		}
	}
	return false
}

// Client is a plain client of this one server, for the test's own checks
// (closed when the test ends). Its timeouts are short: a stalled server
// answers with an error, not a hang.
func (r *Redis) Client() *redis.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.client == nil {
		r.client = redis.NewClient(&redis.Options{
			Addr: r.Addr, Password: r.password, DialTimeout: time.Second, ReadTimeout: 2 * time.Second,
			WriteTimeout: 2 * time.Second, MaxRetries: -1, PoolSize: 4,
			ContextTimeoutEnabled: true,
		})
		c := r.client
		r.t.Cleanup(func() { c.Close() })
	}
	return r.client
}

// replicationInfo is INFO replication as a map (empty on error).
func replicationInfo(r *Redis) map[string]string {
	out := map[string]string{}
	s, err := r.Client().Info(context.Background(), "replication").Result()
	if err != nil {
		return out
	}
	for _, line := range strings.Split(s, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = v
		}
	}
	return out
}

// waitInSync implements Cluster.WaitInSync and Sentinel.WaitInSync over
// the given servers.
func waitInSync(t testing.TB, servers []*Redis, timeout time.Duration) {
	t.Helper()
	byAddr := map[string]*Redis{}
	for _, s := range servers {
		byAddr[s.Addr] = s
	}
	target := map[*Redis]int64{} // replica → master's offset at the start
	for _, s := range servers {
		if !s.Running() {
			continue
		}
		info := replicationInfo(s)
		if info["role"] != "slave" {
			continue
		}
		m := byAddr[info["master_host"]+":"+info["master_port"]]
		if m == nil || !m.Running() {
			continue
		}
		off, _ := strconv.ParseInt(replicationInfo(m)["master_repl_offset"], 10, 64)
		target[s] = off
	}
	for s, off := range target {
		Eventually(t, timeout, "replica "+s.Addr+" in sync", func() bool {
			info := replicationInfo(s)
			got, err := strconv.ParseInt(info["slave_repl_offset"], 10, 64)
			return err == nil && info["master_link_status"] == "up" && got >= off
		})
	}
}

// Stall makes the server stop answering for d (DEBUG SLEEP, sent on a
// connection of its own in the background: the server accepts connections
// and reads commands but runs none) and returns once it has stopped
// answering. Every server testenv starts allows DEBUG.
func (r *Redis) Stall(d time.Duration) {
	r.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: r.Addr, Password: r.password, ReadTimeout: d + 5*time.Second, MaxRetries: -1})
	r.t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		r.t.Fatalf("ping %s before stalling it: %v", r.Addr, err)
	}
	go c.Do(context.Background(), "DEBUG", "SLEEP", d.Seconds())
	probe := redis.NewClient(&redis.Options{Addr: r.Addr, Password: r.password, MaxRetries: -1, ContextTimeoutEnabled: true})
	defer probe.Close()
	Eventually(r.t, 5*time.Second, r.Addr+" to stall", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		return probe.Ping(ctx).Err() != nil
	})
}
