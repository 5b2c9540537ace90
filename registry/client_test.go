package registry

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/redis/go-redis/v9"
)

func TestRedactURL(t *testing.T) {
	cases := map[string]string{
		"redis://:s3cret@host:6379/0":                 "redis://:xxxxx@host:6379/0",
		"rediss://alice:s3cret@host:6380":             "rediss://alice:xxxxx@host:6380",
		"redis://alice@host:6379":                     "redis://alice@host:6379",
		"redis://host:6379/2":                         "redis://host:6379/2",
		"redis+cluster://bob:p%40ss@h1:1,h2:2,h3:3":   "redis+cluster://bob:xxxxx@h1:1,h2:2,h3:3",
		"redis://host:6379?password=s3cret&db=1":      "redis://host:6379?db=1&password=xxxxx",
		"redis://u:with@at@host:1":                    "redis://u:xxxxx@host:1",
		"not a url but user:pw@host":                  "xxxxx@host",
		"rediss+cluster://:only@h1:7000,h2:7001/?x=1": "rediss+cluster://:xxxxx@h1:7000,h2:7001/?x=1",
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
		c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: selection.Limits{MaxConcurrent: 1}})
		if err != nil {
			t.Fatalf("claim through %s: %v", RedactURL(tc.url), err)
		}
		if err := r.Release(ctx, "p", c.LeaseID); err != nil {
			t.Fatal(err)
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
