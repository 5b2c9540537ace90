package registry

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/redis/go-redis/v9"
)

func TestRedactURL(t *testing.T) {
	cases := map[string]string{
		"redis://:s3cret@host:6379/0":                                               "redis://:xxxxx@host:6379/0",
		"rediss://alice:s3cret@host:6380":                                           "rediss://alice:xxxxx@host:6380",
		"redis://alice@host:6379":                                                   "redis://alice@host:6379",
		"redis://host:6379/2":                                                       "redis://host:6379/2",
		"redis+cluster://bob:p%40ss@h1:1,h2:2,h3:3":                                 "redis+cluster://bob:xxxxx@h1:1,h2:2,h3:3",
		"redis://host:6379?password=s3cret&db=1":                                    "redis://host:6379?db=1&password=xxxxx",
		"redis://u:with@at@host:1":                                                  "redis://u:xxxxx@host:1",
		"not a url but user:pw@host":                                                "xxxxx@host",
		"rediss+cluster://:only@h1:7000,h2:7001/?x=1":                               "rediss+cluster://:xxxxx@h1:7000,h2:7001/?x=1",
		"redis+sentinel://:s3cret@grid@h1:1,h2:2/0":                                 "redis+sentinel://:xxxxx@grid@h1:1,h2:2/0",
		"redis+sentinel://alice:s3cret@grid@h1:1":                                   "redis+sentinel://alice:xxxxx@grid@h1:1",
		"redis+sentinel://alice@grid@h1:1":                                          "redis+sentinel://alice@grid@h1:1",
		"redis+sentinel://grid@h1:1,h2:2/3":                                         "redis+sentinel://grid@h1:1,h2:2/3",
		"redis+sentinel://grid@h1:1/0?sentinel_password=s3cret&sentinel_username=s": "redis+sentinel://grid@h1:1/0?sentinel_password=xxxxx&sentinel_username=s",
		"rediss+sentinel://u:p%40ss@grid@h1:1?sentinel_password=s3cret":             "rediss+sentinel://u:xxxxx@grid@h1:1?sentinel_password=xxxxx",
	}
	for in, want := range cases {
		got := RedactURL(in)
		if got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
		if strings.Contains(got, "s3cret") || strings.Contains(got, "p%40ss") {
			t.Errorf("RedactURL(%q) leaks the password: %q", in, got)
		}
	}
}

func TestNewClientRejectsBadURLs(t *testing.T) {
	for _, u := range []string{
		"http://host:1",
		"host:6379",
		"redis+cluster://h1:1,,h2:2",
		"redis+cluster://h1:1,h2:2/3",
		"redis://:s3cret@host:notaport",
		"redis+sentinel://h1:1,h2:2/0",                      // no master name
		"redis+sentinel://:s3cret@@h1:1/0",                  // empty master name
		"redis+sentinel://:s3cret@grid@h1:1/0/1",            // two path segments
		"redis+sentinel://:s3cret@grid@h1:1/x",              // not a database number
		"redis+sentinel://:s3cret@grid@h1:1,,h2:2",          // empty host
		"redis+sentinel://grid@h1:1?password=s3cret",        // credentials belong in the authority
		"redis+sentinel://grid@h1:1?master_name=other",      // so does the master name
		"redis+sentinel://:s3cret@grid@h1:1?no_such=1",      // unknown option
		"redis+cluster://:s3cret@h1:1?read_timeout=forever", // bad duration
	} {
		c, err := NewClient(u)
		if err == nil {
			c.Close()
			t.Errorf("NewClient(%q) accepted", u)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("NewClient(%q) error leaks the password: %v", u, err)
		}
	}
}

// A password (requirepass) and an ACL user with a password and a database
// are accepted, and the registry works through them.
func TestNewClientWithPasswordAndACLUser(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t, "--requirepass", "s3cret",
		"--user", "grid", "on", ">gridpw", "~*", "&*", "+@all")
	for _, tc := range []struct{ url, db string }{
		{"redis://:s3cret@" + srv.Addr + "/0", "0"},
		{"redis://grid:gridpw@" + srv.Addr + "/3", "3"},
	} {
		rdb, err := NewClient(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		defer rdb.Close()
		r := New(rdb, Options{})
		register(t, r, "p", "w", 0)
		c := claim(t, r, ClaimRequest{Group: "p", Policy: LifetimeFirst, Limits: Limits{MaxConcurrent: 1}})
		if _, err := r.EndServed(ctx, "p", c.Worker.ID, []Ended{{Session: c.Session}}); err != nil {
			t.Fatalf("end through %s: %v", RedactURL(tc.url), err)
		}
		// The keys landed in the URL's database.
		admin := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "s3cret", DB: int(tc.db[0] - '0')})
		n, err := admin.Exists(ctx, "{grid:p}:workers").Result()
		admin.Close()
		if err != nil || n != 1 {
			t.Fatalf("workers key in db %s: %d %v", tc.db, n, err)
		}
	}
	bad, err := NewClient("redis://grid:wrong@" + srv.Addr + "/0")
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	ctx2, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := bad.Ping(ctx2).Err(); err == nil {
		t.Fatal("a wrong password was accepted")
	}
}

// Every client honours its context's deadline and gets the package's
// timeouts and retry bound, which the URL's own options override.
func TestNewClientOptions(t *testing.T) {
	type got struct {
		ctxTimeout              bool
		dial, read, write, pool time.Duration
		retries                 int
		user, password          string
		db                      int
	}
	opts := func(t *testing.T, u string) got {
		t.Helper()
		rdb, err := NewClient(u)
		if err != nil {
			t.Fatalf("NewClient(%s): %v", RedactURL(u), err)
		}
		defer rdb.Close()
		switch c := rdb.(type) {
		case *redis.Client:
			o := c.Options()
			return got{o.ContextTimeoutEnabled, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout, o.MaxRetries, o.Username, o.Password, o.DB}
		case *redis.ClusterClient:
			o := c.Options()
			if o.ReadOnly || o.RouteByLatency || o.RouteRandomly {
				t.Errorf("%s: cluster reads may go to replicas", u)
			}
			if o.ClusterStateReloadInterval != clusterStateRefresh {
				t.Errorf("%s: slot map reload interval %s", u, o.ClusterStateReloadInterval)
			}
			return got{o.ContextTimeoutEnabled, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout, o.MaxRetries, o.Username, o.Password, 0}
		}
		t.Fatalf("NewClient(%s) gave %T", u, rdb)
		return got{}
	}
	def := got{true, DefaultDialTimeout, DefaultReadTimeout, DefaultWriteTimeout, DefaultPoolTimeout, DefaultMaxRetries, "", "", 0}
	cases := []struct {
		name, url string
		want      func(g got) got
	}{
		{"single", "redis://h:1/2", func(g got) got { g.db = 2; return g }},
		{"single with options", "redis://u:pw@h:1/0?dial_timeout=1s&read_timeout=500ms&write_timeout=-1&pool_timeout=4s&max_retries=-1",
			func(g got) got {
				g.dial, g.read, g.write, g.pool, g.retries, g.user, g.password = time.Second, 500*time.Millisecond, 0, 4*time.Second, 0, "u", "pw"
				return g
			}},
		{"unix", "unix:///tmp/r.sock?db=1", func(g got) got { g.db = 1; return g }},
		// go-redis' cluster node clients do not retry by themselves (the
		// cluster loop does): MaxRetries stays go-redis' "none".
		{"cluster", "redis+cluster://u:pw@h1:1,h2:2", func(g got) got { g.retries, g.user, g.password = -1, "u", "pw"; return g }},
		{"cluster with options", "redis+cluster://h1:1,h2:2?read_timeout=1s", func(g got) got { g.retries, g.read = -1, time.Second; return g }},
		// The userinfo authenticates to the data nodes (Options are theirs).
		{"sentinel", "redis+sentinel://u:pw@grid@h1:1,h2:2/3?sentinel_password=spw", func(g got) got {
			g.user, g.password, g.db = "u", "pw", 3
			return g
		}},
		{"sentinel with options", "redis+sentinel://grid@h1:1?read_timeout=1s&max_retries=5", func(g got) got {
			g.read, g.retries = time.Second, 5
			return g
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if g, w := opts(t, tc.url), tc.want(def); g != w {
				t.Errorf("NewClient(%s):\n got %+v\nwant %+v", tc.url, g, w)
			}
		})
	}
}

// errorReply is an error reply as go-redis returns one.
type errorReply string

func (e errorReply) Error() string { return string(e) }
func (errorReply) RedisError()     {}

// Only an error that proves a script never ran lets the client send it
// again; every error that may mean a lost node reloads a Cluster's slots.
func TestRetryClassification(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	cases := []struct {
		name             string
		err              error
		notRun, topology bool
	}{
		{"dial refused", fmt.Errorf("claiming: %w", refused), true, true},
		{"no pooled connection", redis.ErrPoolTimeout, true, false},
		{"LOADING", errorReply("LOADING Redis is loading the dataset in memory"), true, false},
		{"MASTERDOWN", errorReply("MASTERDOWN Link with MASTER is down"), true, true},
		{"READONLY", errorReply("READONLY You can't write against a read only replica."), true, true},
		{"CLUSTERDOWN", errorReply("CLUSTERDOWN The cluster is down"), true, true},
		{"TRYAGAIN", errorReply("TRYAGAIN Multiple keys request during rehashing of slot"), true, true},
		{"too many clients", errorReply("ERR max number of clients reached"), true, false},
		{"EOF after the write", io.EOF, false, true},
		{"reset after the write", reset, false, true},
		{"read timeout", timeout, false, true},
		// A host that vanished (no refusal, no reset) only ever times out.
		{"deadline", context.DeadlineExceeded, false, true},
		{"canceled", context.Canceled, false, false},
		{"script error", errorReply("ERR user_script:1: boom"), false, false},
		{"NOSCRIPT", errorReply("NOSCRIPT No matching script"), false, false},
		// Not resent as it is: Registry.fcall loads the library, then calls
		// once more (resending first would only find it missing again).
		{"function not found", errorReply("ERR Function not found"), false, false},
	}
	for _, tc := range cases {
		if got := notRun(tc.err); got != tc.notRun {
			t.Errorf("%s: notRun = %v, want %v", tc.name, got, tc.notRun)
		}
		if got := topologyError(tc.err); got != tc.topology {
			t.Errorf("%s: topologyError = %v, want %v", tc.name, got, tc.topology)
		}
	}
}

// rediss+sentinel:// speaks TLS to sentinels and data nodes alike, each
// verified against the host it dials (no fixed server name).
func TestSentinelTLSOptions(t *testing.T) {
	rdb, err := NewClient("rediss+sentinel://grid@sentinel-1:26379,sentinel-2:26379/0")
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	o := rdb.(*redis.Client).Options()
	if o.TLSConfig == nil || o.TLSConfig.ServerName != "" || o.TLSConfig.InsecureSkipVerify {
		t.Fatalf("TLS config %+v, want TLS verified against each host dialled", o.TLSConfig)
	}
}

// FuzzRedactSentinelURL: neither the data nodes' password (before the
// master name) nor the sentinels' (an option) survives redaction.
func FuzzRedactSentinelURL(f *testing.F) {
	f.Add("user", "s3cretpw", "grid", "h1:1,h2:2", "/0", "sentinelpw")
	f.Add("", "pässwörd", "my-master", "h:1", "", "")
	f.Fuzz(func(t *testing.T, user, pass, master, hosts, path, spass string) {
		// A secret that is part of the URL's fixed text cannot be told apart.
		all := user + master + hosts + path + "redis+sentinel://?sentinel_password=xxxxx"
		if len(pass) < 6 || strings.ContainsAny(pass, "@/?#") || strings.Contains(all, pass) ||
			strings.ContainsAny(user, ":@/?") || strings.ContainsAny(master+hosts+path, "@?#") ||
			strings.ContainsAny(master+hosts, "/") || master == "" {
			return
		}
		u := "redis+sentinel://" + user + ":" + pass + "@" + master + "@" + hosts + path
		check := []string{pass}
		if len(spass) >= 6 && !strings.Contains(all+pass, spass) && !strings.Contains(all, url.QueryEscape(spass)) {
			u += "?" + url.Values{"sentinel_password": {spass}}.Encode()
			check = append(check, spass, url.QueryEscape(spass))
		}
		got := RedactURL(u)
		for _, secret := range check {
			if strings.Contains(got, secret) {
				t.Fatalf("RedactURL(%q) = %q keeps a password", u, got)
			}
		}
		if !strings.Contains(got, "@"+master+"@") {
			t.Fatalf("RedactURL(%q) = %q lost the master name", u, got)
		}
	})
}
