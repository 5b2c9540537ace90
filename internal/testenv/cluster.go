package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Cluster is a three-node Redis Cluster (masters only) started for one test.
type Cluster struct {
	// Addrs are the nodes' host:port.
	Addrs []string
	nodes []*Redis
}

// URL is the redis+cluster:// URL of the cluster (registry.NewClient reads it).
func (c *Cluster) URL() string { return "redis+cluster://" + strings.Join(c.Addrs, ",") }

// StartCluster starts three redis-server nodes with --cluster-enabled on
// free ports, each in its own temp dir, joins them with
// `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes` and
// waits until every node reports cluster_state:ok. The nodes stop when the
// test ends.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	cli := LookPath(t, "redis-cli")
	c := &Cluster{}
	for range 3 {
		// nodes.conf lands in the node's own temp dir (its --dir).
		n := StartRedis(t, "--cluster-enabled", "yes", "--cluster-node-timeout", "2000")
		c.nodes = append(c.nodes, n)
		c.Addrs = append(c.Addrs, n.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, n := range c.nodes {
		for {
			info, err := exec.Command(cli, "-p", strconv.Itoa(n.Port), "cluster", "info").CombinedOutput()
			if err == nil && strings.Contains(string(info), "cluster_state:ok") &&
				strings.Contains(string(info), "cluster_known_nodes:3") {
				break
			}
			if time.Now().After(deadline) {
				logs, _ := os.ReadFile(filepath.Join(n.Dir, "redis.log"))
				t.Fatalf("cluster node %s not ready: %s %v\n%s", n.Addr, info, err, logs)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}
