package workeragent

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestParseFlagsDefaults(t *testing.T) {
	c, err := ParseFlags(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Pool != "chromium" || c.HeartbeatInterval != 10*time.Second || c.ProxyTimeout != 15*time.Second ||
		c.DrainTimeout != 30*time.Second || c.Launcher != "playwright" || c.Respawn {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestEnvironmentAndFlagPrecedence(t *testing.T) {
	e := env(map[string]string{
		"REDIS_URL":               "redis://redis:6379/2",
		"POOL":                    "team-a",
		"BROWSER_TYPE":            "chromium",
		"LAUNCHER":                "fake",
		"PRIVATE_HOSTNAME":        "worker-7",
		"MAX_CONCURRENT_SESSIONS": "4",
		"HEARTBEAT_INTERVAL":      "5", // seconds, as the seed writes it
		"PROXY_TIMEOUT":           "20s",
		"DRAIN_TIMEOUT":           "45",
		"RESPAWN":                 "true",
		"REDIS_RETRY_ATTEMPTS":    "3",
	})
	c, err := ParseFlags([]string{"-max-concurrent", "6", "-pool", "team-b"}, e, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{RedisURL: "redis://redis:6379/2", Pool: "team-b", Launcher: "fake", Advertise: "worker-7", MaxConcurrent: 6,
		HeartbeatInterval: 5 * time.Second, ProxyTimeout: 20 * time.Second, DrainTimeout: 45 * time.Second, Respawn: true, RedisRetryAttempts: 3}
	if c.RedisURL != want.RedisURL || c.Pool != want.Pool || c.Launcher != want.Launcher || c.Advertise != want.Advertise ||
		c.MaxConcurrent != want.MaxConcurrent || c.HeartbeatInterval != want.HeartbeatInterval || c.ProxyTimeout != want.ProxyTimeout ||
		c.DrainTimeout != want.DrainTimeout || c.Respawn != want.Respawn || c.RedisRetryAttempts != want.RedisRetryAttempts {
		t.Fatalf("got %+v", c)
	}
	// A bare -respawn=false overrides RESPAWN=true.
	c, err = ParseFlags([]string{"-respawn=false"}, e, io.Discard)
	if err != nil || c.Respawn {
		t.Fatalf("respawn=false: %v %v", c.Respawn, err)
	}
}

func TestBadConfigurationsNameTheProblem(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want []string // every piece must appear in the error
	}{
		{"heartbeat not below stale threshold", []string{"-heartbeat-interval", "20s", "-stale-threshold", "15s"}, nil,
			[]string{"heartbeat interval < stale threshold", "20s", "stale-threshold 15s"}},
		{"timing from the environment", nil, map[string]string{"HEARTBEAT_INTERVAL": "40", "STALE_THRESHOLD": "30"},
			[]string{"heartbeat interval < stale threshold", "heartbeat-interval 40s", "stale-threshold 30s"}},
		{"proxy timeout too short", []string{"-proxy-timeout", "1s"}, nil, []string{"-proxy-timeout", "3s"}},
		{"bad env duration", nil, map[string]string{"HEARTBEAT_INTERVAL": "often"}, []string{"HEARTBEAT_INTERVAL", "often", "duration"}},
		{"bad env number", nil, map[string]string{"MAX_CONCURRENT_SESSIONS": "lots"}, []string{"MAX_CONCURRENT_SESSIONS", "whole number"}},
		{"bad env bool", nil, map[string]string{"RESPAWN": "sometimes"}, []string{"RESPAWN", "boolean"}},
		{"weight out of range", []string{"-weight", "10001"}, nil, []string{"-weight", "10001", "0-10000"}},
		{"negative weight from the environment", nil, map[string]string{"WORKER_WEIGHT": "-1"}, []string{"-weight", "-1"}},
		{"zero heartbeat", []string{"-heartbeat-interval", "0"}, nil, []string{"-heartbeat-interval must be positive"}},
		{"zero probe failures", []string{"-probe-failures", "0"}, nil, []string{"-probe-failures must be at least 1", "0"}},
		{"unknown launcher", []string{"-launcher", "selenium"}, nil, []string{"-launcher", "selenium"}},
		{"exec without command", []string{"-launcher", "exec"}, nil, []string{"-exec"}},
		{"cdp with firefox", []string{"-launcher", "cdp", "-browser-type", "firefox"}, nil, []string{"cdp", "firefox"}},
		{"unknown browser", []string{"-browser-type", "lynx"}, nil, []string{"-browser-type", "lynx"}},
		{"bad pool", []string{"-pool", "a b"}, nil, []string{"-pool", "a b"}},
		{"pool naming a version group", []string{"-pool", "chromium@1.65"}, nil, []string{"-pool", "chromium@1.65"}},
		{"bad playwright version", []string{"-playwright-version", "1.64.1"}, nil, []string{"-playwright-version", "1.64.1", "major.minor"}},
		{"playwright version without the playwright launcher", []string{"-launcher", "cdp", "-playwright-version", "1.64"}, nil, []string{"-playwright-version", "cdp"}},
		{"bad port", []string{"-port", "70000"}, nil, []string{"-port", "70000"}},
		{"negative capacity", []string{"-max-concurrent", "-1"}, nil, []string{"-max-concurrent", "-1"}},
		{"bad advertise", []string{"-advertise", "host:99999"}, nil, []string{"-advertise", "host:99999"}},
		{"ws path", []string{"-ws-path", "playwright"}, nil, []string{"-ws-path"}},
		{"no attempts", []string{"-redis-retry-attempts", "0"}, nil, []string{"-redis-retry-attempts"}},
		{"log format", []string{"-log-format", "xml"}, nil, []string{"-log-format", "xml"}},
		{"brace in key prefix", []string{"-key-prefix", "gr}id"}, nil, []string{"-key-prefix", "'}'", "hash tag"}},
		{"stray argument", []string{"chromium"}, nil, []string{"unexpected arguments"}},
		{"unknown flag", []string{"-heartbeat", "1s"}, nil, []string{"heartbeat"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseFlags(tc.args, env(tc.env), io.Discard)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{"10": 10 * time.Second, "0.5": 500 * time.Millisecond, "250ms": 250 * time.Millisecond, " 1m ": time.Minute} {
		if got, err := ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseDuration("soon"); err == nil {
		t.Error("ParseDuration(soon) succeeded")
	}
}

func TestOptionsHaveFlagsAndEnvVars(t *testing.T) {
	seen := map[string]bool{}
	for _, o := range Options() {
		if o.Flag == "" || o.Env == "" || o.Usage == "" || seen[o.Flag] || seen[o.Env] {
			t.Fatalf("option %+v is incomplete or repeated", o)
		}
		seen[o.Flag], seen[o.Env] = true, true
	}
	// The worker lifecycle's names (a record has no TTL: Caddy's stale_threshold is its bound).
	for _, env := range []string{"REDIS_URL", "POOL", "BROWSER_TYPE", "LAUNCHER", "PRIVATE_HOSTNAME", "MAX_CONCURRENT_SESSIONS", "HEARTBEAT_INTERVAL", "STALE_THRESHOLD", "DRAIN_TIMEOUT", "RESPAWN", "REDIS_RETRY_ATTEMPTS"} {
		if !seen[env] {
			t.Errorf("no option reads %s", env)
		}
	}
}

func TestNewIDUniquePerLaunch(t *testing.T) {
	a, b := NewID("host"), NewID("host")
	if a == b || !strings.HasPrefix(a, "host-") {
		t.Fatalf("ids %q %q", a, b)
	}
}

// TestOperationsDocListsEveryFlag keeps the flags table of
// docs/operations.md (its "## Flags" section) in step with the flags the
// agent really has: a flag or variable missing from the table fails it.
func TestOperationsDocListsEveryFlag(t *testing.T) {
	const page = "docs/operations.md"
	raw, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(page)))
	if err != nil {
		t.Fatalf("reading the flags table: %v", err)
	}
	s := string(raw)
	start := strings.Index(s, "\n## Flags\n")
	if start < 0 {
		t.Fatalf("%s has no \"## Flags\" section", page)
	}
	section := s[start+1:]
	if end := strings.Index(section[len("## Flags"):], "\n## "); end >= 0 {
		section = section[:len("## Flags")+end]
	}
	for _, o := range Options() {
		row := "| `-" + o.Flag + "` | `" + o.Env + "` |"
		if !strings.Contains(section, row) {
			t.Errorf("%s flags table has no row starting %q", page, row)
		}
	}
}

// TestACDPWorkerTakesOneSessionUnlessTold: a CDP session drives its whole
// browser, seeing and able to close every other session's pages, so a cdp
// worker's capacity is 1 unless -max-concurrent says more.
func TestACDPWorkerTakesOneSessionUnlessTold(t *testing.T) {
	c, err := ParseFlags([]string{"-launcher", "cdp"}, env(nil), io.Discard)
	if err != nil || c.MaxConcurrent != 1 {
		t.Fatalf("cdp by default: max concurrent %d (%v), want 1", c.MaxConcurrent, err)
	}
	c, err = ParseFlags([]string{"-launcher", "cdp", "-max-concurrent", "3"}, env(nil), io.Discard)
	if err != nil || c.MaxConcurrent != 3 {
		t.Fatalf("cdp -max-concurrent 3: %d (%v)", c.MaxConcurrent, err)
	}
}

// TestAnOperatorsExecutableIsNotSwappedForTheHeadlessShell: headless
// browsers run on Debian's headless shell only when the operator named
// no browser of their own, or named the shell.
func TestAnOperatorsExecutableIsNotSwappedForTheHeadlessShell(t *testing.T) {
	for _, tc := range []struct {
		browser, executable, shell, want string
	}{
		{"chromium", "", "", "chromium-headless-shell"},
		{"chromium", "/opt/google/chrome/chrome", "", ""},
		{"chromium", "/opt/google/chrome/chrome", "/opt/shell", "/opt/shell"},
		{"chromium", "", "none", ""},
		{"firefox", "", "", ""},
	} {
		c, err := ParseFlags([]string{"-browser-type", tc.browser, "-executable", tc.executable, "-headless-shell", tc.shell}, env(nil), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if got := headlessShell(c); got != tc.want {
			t.Errorf("%s, -executable %q, -headless-shell %q: %q, want %q", tc.browser, tc.executable, tc.shell, got, tc.want)
		}
	}
}
