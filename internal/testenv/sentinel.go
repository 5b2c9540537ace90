package testenv

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinel timing of StartSentinel: a master that does not answer for
// SentinelDownAfter is subjectively down; once a quorum agrees, one
// sentinel promotes a replica (failover-timeout SentinelFailoverTimeout).
const (
	SentinelDownAfter       = time.Second
	SentinelFailoverTimeout = 3 * time.Second
)

// Sentinel is a Redis master with replicas watched by three sentinels
// (quorum 2), started for one test.
type Sentinel struct {
	// MasterName is the name the sentinels monitor ("grid").
	MasterName string
	// Servers are the data nodes: the first master, then its replicas.
	Servers []*Redis
	// Sentinels are the three sentinel processes.
	Sentinels []*Redis
	// Password is the data nodes' requirepass (and masterauth), and
	// SentinelPassword the sentinels' requirepass; "" for none. URL
	// carries both.
	Password, SentinelPassword string
	t                          testing.TB
	clients                    map[*Redis]*redis.SentinelClient
}

// URL is the redis+sentinel:// URL of the group, database 0
// (registry.NewClient reads it).
func (s *Sentinel) URL() string {
	addrs := make([]string, len(s.Sentinels))
	for i, x := range s.Sentinels {
		addrs[i] = x.Addr
	}
	u := "redis+sentinel://"
	if s.Password != "" {
		u += ":" + url.PathEscape(s.Password) + "@"
	}
	u += s.MasterName + "@" + strings.Join(addrs, ",") + "/0"
	if s.SentinelPassword != "" {
		u += "?" + url.Values{"sentinel_password": {s.SentinelPassword}}.Encode()
	}
	return u
}

// StartSentinel starts a master, replicas replicas of it and three
// sentinels with redis-server --sentinel (down-after-milliseconds
// SentinelDownAfter, failover-timeout SentinelFailoverTimeout), each on a
// free port in its own temp dir, and returns once every replica is in sync
// and every sentinel knows the master, every replica and the two other
// sentinels. Everything stops when the test ends.
func StartSentinel(t testing.TB, replicas int) *Sentinel {
	t.Helper()
	return StartSentinelAuth(t, replicas, "", "")
}

// StartSentinelAuth is StartSentinel with passwords: password for the data
// nodes (requirepass and masterauth, and the sentinels' auth-pass),
// sentinelPassword for the sentinels themselves; "" for none.
func StartSentinelAuth(t testing.TB, replicas int, password, sentinelPassword string) *Sentinel {
	t.Helper()
	s := &Sentinel{MasterName: "grid", t: t, clients: map[*Redis]*redis.SentinelClient{},
		Password: password, SentinelPassword: sentinelPassword}
	var auth []string
	if password != "" {
		auth = []string{"--requirepass", password, "--masterauth", password}
	}
	master := StartRedis(t, auth...)
	s.Servers = append(s.Servers, master)
	for range replicas {
		args := append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port)}, auth...)
		s.Servers = append(s.Servers, StartRedis(t, args...))
	}
	s.WaitInSync(30 * time.Second)
	conf := fmt.Sprintf(`sentinel monitor %[1]s 127.0.0.1 %[2]d 2
sentinel down-after-milliseconds %[1]s %[3]d
sentinel failover-timeout %[1]s %[4]d
sentinel parallel-syncs %[1]s 1
`, s.MasterName, master.Port, SentinelDownAfter.Milliseconds(), SentinelFailoverTimeout.Milliseconds())
	if password != "" {
		conf += fmt.Sprintf("sentinel auth-pass %s %s\n", s.MasterName, password)
	}
	if sentinelPassword != "" {
		// A sentinel uses its own requirepass to talk to the other sentinels.
		conf += fmt.Sprintf("requirepass %s\n", sentinelPassword)
	}
	for range 3 {
		x := &Redis{Dir: t.TempDir(), t: t, conf: conf}
		x.launch(true)
		t.Cleanup(x.Stop)
		s.Sentinels = append(s.Sentinels, x)
	}
	ctx := context.Background()
	for _, x := range s.Sentinels {
		sc := s.sentinelClient(x)
		Eventually(t, 30*time.Second, "sentinel "+x.Addr+" to know the group", func() bool {
			m, err := sc.Master(ctx, s.MasterName).Result()
			if err != nil {
				return false
			}
			n, _ := strconv.Atoi(m["num-slaves"])
			k, _ := strconv.Atoi(m["num-other-sentinels"])
			return n == replicas && k == len(s.Sentinels)-1 && !strings.Contains(m["flags"], "down")
		})
	}
	return s
}

// sentinelClient is a client of one sentinel (closed when the test ends).
func (s *Sentinel) sentinelClient(x *Redis) *redis.SentinelClient {
	if c := s.clients[x]; c != nil {
		return c
	}
	c := redis.NewSentinelClient(&redis.Options{Addr: x.Addr, Password: s.SentinelPassword, DialTimeout: time.Second,
		ReadTimeout: 2 * time.Second, MaxRetries: -1, ContextTimeoutEnabled: true})
	s.t.Cleanup(func() { c.Close() })
	s.clients[x] = c
	return c
}

// server is the data node at addr, or nil.
func (s *Sentinel) server(addr string) *Redis {
	for _, r := range s.Servers {
		if r.Addr == addr {
			return r
		}
	}
	return nil
}

// Master (not safe for concurrent use) is the data node a majority of the running sentinels name as
// the master, or nil while they do not agree.
func (s *Sentinel) Master() *Redis {
	votes := map[string]int{}
	live := 0
	for _, x := range s.Sentinels {
		if !x.Running() {
			continue
		}
		live++
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		a, err := s.sentinelClient(x).GetMasterAddrByName(ctx, s.MasterName).Result()
		cancel()
		if err == nil && len(a) == 2 {
			votes[net.JoinHostPort(a[0], a[1])]++
		}
	}
	for addr, n := range votes {
		if 2*n > live {
			return s.server(addr)
		}
	}
	return nil
}

// inTilt says whether a running sentinel is in TILT mode. A sentinel
// whose timer ran late by more than 2 s (a loaded machine) enters it for
// 30 s, and meanwhile fails nothing over and reconfigures no instance.
func (s *Sentinel) inTilt() bool {
	for _, x := range s.Sentinels {
		if !x.Running() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		cmd := redis.NewStringCmd(ctx, "info", "sentinel")
		_ = s.sentinelClient(x).Process(ctx, cmd)
		info, err := cmd.Result()
		cancel()
		if err == nil && strings.Contains(info, "sentinel_tilt:1") {
			return true
		}
	}
	return false
}

// Eventually is testenv's Eventually for what the sentinels do: time
// during which one of them is in TILT mode does not count towards timeout
// (up to three times timeout in all), so a loaded machine that stalls
// them for a while does not fail the wait.
func (s *Sentinel) Eventually(timeout time.Duration, what string, cond func() bool) {
	s.t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	lastTilt, tilted := start, time.Duration(0)
	for !cond() {
		now := time.Now()
		if now.Sub(lastTilt) >= 500*time.Millisecond {
			if s.inTilt() {
				tilted += now.Sub(lastTilt)
				deadline = start.Add(min(3*timeout, timeout+tilted))
			}
			lastTilt = now
		}
		if now.After(deadline) {
			var logs strings.Builder
			for _, x := range s.Sentinels {
				fmt.Fprintf(&logs, "\n--- sentinel %s, log tail:\n%s", x.Addr, tail(x.log(), 2000))
			}
			s.t.Fatalf("timed out after %s (%s of it with a sentinel in TILT mode) waiting for %s%s",
				now.Sub(start).Round(time.Second), tilted.Round(time.Second), what, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitFailover waits until the sentinels name another master than old and
// that server says it is a master; it returns it.
func (s *Sentinel) WaitFailover(old *Redis, timeout time.Duration) *Redis {
	s.t.Helper()
	var m *Redis
	s.Eventually(timeout, "the sentinels to promote a replica of "+old.Addr, func() bool {
		m = s.Master()
		return m != nil && m != old && m.Running() && replicationInfo(m)["role"] == "master"
	})
	return m
}

// WaitInSync waits until every running replica's link is up and it has
// applied what its master had written when the wait began.
func (s *Sentinel) WaitInSync(timeout time.Duration) {
	s.t.Helper()
	waitInSync(s.t, s.Servers, timeout)
}
