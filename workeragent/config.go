package workeragent

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

// Launcher names.
const (
	// LauncherPlaywright: Playwright's browser server, one browser the
	// worker's sessions share.
	LauncherPlaywright = "playwright"
	// LauncherPlaywrightServer: Playwright's run-server, a browser of
	// its own for each session, with the client's launch options.
	LauncherPlaywrightServer = "playwright-server"
	LauncherCDP              = "cdp"
	LauncherExec             = "exec"
	LauncherFake             = "fake"
)

// Config is everything the agent needs. ParseFlags fills it from the
// command line and the environment; Validate checks it.
type Config struct {
	// RedisURL names the Redis (see registry.NewClient for the forms).
	// Default: "redis://127.0.0.1:6379/0".
	RedisURL string
	// KeyPrefix is the registry's key prefix; it must match the Caddy
	// side's. Default: "grid".
	KeyPrefix string
	// Pool the worker registers in. Default: BrowserType.
	Pool string
	// BrowserType is chromium, firefox or webkit. Default: "chromium".
	BrowserType string
	// Launcher is playwright, cdp, exec or fake. Default: "playwright".
	Launcher string
	// Advertise is the host or host:port a proxy dials to reach the agent
	// (for containers whose bind address is not reachable). A bare host
	// takes the agent's port. Default: Host:Port (the machine's hostname
	// when Host is 0.0.0.0).
	Advertise string
	// Host is the address the agent listens on for proxies. The browser
	// itself listens on loopback only. Default: "127.0.0.1".
	Host string
	// Port is the agent's port. Default: 0 (a free port).
	Port int
	// WSPath is the WebSocket path of the playwright and fake launchers
	// (the cdp launcher registers Chromium's /devtools/browser/<id>).
	// Default: "/playwright".
	WSPath string
	// MaxConcurrent is the worker's own session capacity, registered with
	// it. Default: 0 (no limit of its own; the grid's max_concurrent
	// applies).
	MaxConcurrent int
	// VirtualNodes is the worker's ring positions for the vnode policy.
	// Default: 0 (the registry's default, 8).
	VirtualNodes int
	// Weight is the worker's share of turns under the
	// interleaved_weighted_round_robin policy, 0-10000. Default: 0 (its
	// MaxConcurrent, or 1 when that is 0).
	Weight int

	// HeartbeatInterval is how often the agent reports its browsers'
	// sessions and counts. Default: 10s.
	HeartbeatInterval time.Duration
	// StaleThreshold is Caddy's stale_threshold, the heartbeat age past
	// which Caddy skips and removes a worker; used only to check the
	// timing rule. Default: 30s.
	StaleThreshold time.Duration
	// DrainTimeout bounds the wait for a retiring browser's sessions;
	// those left then are closed. Default: 30s.
	DrainTimeout time.Duration
	// ProxyTimeout is how long the agent waits for a proxy's connection
	// that stopped answering (its host vanished without closing it):
	// TCP keepalive and TCP_USER_TIMEOUT end it within this, idle or
	// not, and its session with it. Default: 15s.
	ProxyTimeout time.Duration
	// ProbeTimeout bounds each health probe of the browser, run every
	// heartbeat. 0 disables probes (process exit is still noticed at
	// once). Default: 5s.
	ProbeTimeout time.Duration
	// ProbeFailures is how many probes in a row must fail before the
	// browser is restarted with whatever sessions it has: one slow answer
	// from a busy browser is not a hang. Default: 3.
	ProbeFailures int
	// StartTimeout bounds the wait for a launched browser to print its
	// endpoint. Default: 60s.
	StartTimeout time.Duration

	// RedisRetryAttempts is how many times the agent tries Redis at start
	// before it gives up (the worker lifecycle's REDIS_RETRY_ATTEMPTS). Default: 10.
	RedisRetryAttempts int
	// RedisRetryDelay is the first wait between those attempts; it doubles
	// up to 5s. Default: 1s.
	RedisRetryDelay time.Duration

	// Respawn makes the agent start a fresh browser and register anew after
	// a drain or a crash, instead of exiting. Default: false.
	Respawn bool
	// RespawnMaxBackoff caps the wait before relaunching a browser that
	// crashed; the wait starts at 1s and doubles. Default: 30s.
	RespawnMaxBackoff time.Duration

	// Executable is the browser binary. Default: /usr/bin/chromium for
	// chromium, Playwright's own build for firefox and webkit.
	Executable string
	// Node is the node binary of the playwright launchers. Default: "node".
	Node string
	// HeadlessShell is the Chromium the playwright launchers run headless
	// browsers on, as Playwright runs its own headless shell; "none", or
	// none found: Executable. Default: "chromium-headless-shell" on PATH
	// when Executable is not set (an operator's own browser is not
	// swapped for Debian's shell).
	HeadlessShell string
	// FFmpeg records the playwright launchers' videos; "none": no video.
	// Default: "ffmpeg" on PATH.
	FFmpeg string
	// DiskMax bounds a browser's temporary files (videos, traces,
	// downloads a shared browser keeps until it closes), in bytes: past
	// it the browser retires. 0: no bound. Default: 2 GiB.
	DiskMax int64
	// LaunchScript is playwright/launch-server.mjs. Default: found beside
	// the grid-worker binary (../playwright/ or ./playwright/) or in the
	// working directory.
	LaunchScript string
	// PlaywrightVersion picks which installed playwright-core the
	// playwright launcher loads, as major.minor ("1.64": the npm alias
	// playwright-core-1.64 under playwright/node_modules). The worker
	// registers in the group of the version the launcher reports it
	// loaded (read from that package's package.json), so only clients of
	// that major.minor reach it. Default: "" (the newest installed).
	PlaywrightVersion string
	// Exec is the command (run by /bin/sh -c) of the exec launcher; it
	// must print its ws:// endpoint on stdout.
	Exec string
	// Fakebrowser is the fakebrowser binary of the fake launcher. Default:
	// beside the grid-worker binary, else on PATH.
	Fakebrowser string
	// FakeArgs are extra fakebrowser flags, space-separated (e.g.
	// "-echo-delay 100ms").
	FakeArgs string

	// WorkerSecret, when set, signs the worker's record (HMAC-SHA256
	// over pool, ID, address, path and registration) so that a Caddy
	// configured with the same worker_secret dials it; never logged.
	// Prefer the environment variable to the flag (a flag shows in the
	// process list). Default: none (unsigned records).
	WorkerSecret string

	// IDPrefix starts every worker ID (<prefix>-<pid>-<random>).
	// Default: the hostname.
	IDPrefix string
	// LogFormat is json or console. Default: "json".
	LogFormat string
	// LogLevel is debug, info, warn or error. Default: "info".
	LogLevel string
}

// Defaults returns a Config with every default filled in.
func Defaults() Config {
	return Config{
		RedisURL:           "redis://127.0.0.1:6379/0",
		KeyPrefix:          "grid",
		BrowserType:        "chromium",
		Launcher:           LauncherPlaywright,
		Host:               "127.0.0.1",
		WSPath:             "/playwright",
		HeartbeatInterval:  10 * time.Second,
		StaleThreshold:     30 * time.Second,
		DrainTimeout:       30 * time.Second,
		ProxyTimeout:       15 * time.Second,
		ProbeTimeout:       5 * time.Second,
		ProbeFailures:      3,
		StartTimeout:       60 * time.Second,
		RedisRetryAttempts: 10,
		RedisRetryDelay:    time.Second,
		RespawnMaxBackoff:  30 * time.Second,
		Node:               "node",
		FFmpeg:             "ffmpeg",
		DiskMax:            2 << 30,
		LogFormat:          "json",
		LogLevel:           "info",
	}
}

// Option describes one setting: its flag, environment variable, default
// and meaning (docs/operations.md's flags table is checked against the same list).
type Option struct {
	Flag, Env, Default, Usage string
}

// binding ties an Option to the Config field it sets.
type binding struct {
	Option
	set func(c *Config, v string) error
}

func bindings() []binding {
	d := Defaults()
	str := func(p func(*Config) *string) func(*Config, string) error {
		return func(c *Config, v string) error { *p(c) = v; return nil }
	}
	num := func(p func(*Config) *int) func(*Config, string) error {
		return func(c *Config, v string) error {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return fmt.Errorf("not a whole number")
			}
			*p(c) = n
			return nil
		}
	}
	dur := func(p func(*Config) *time.Duration) func(*Config, string) error {
		return func(c *Config, v string) error {
			x, err := ParseDuration(v)
			if err != nil {
				return err
			}
			*p(c) = x
			return nil
		}
	}
	return []binding{
		{Option{"redis", "REDIS_URL", d.RedisURL, "Redis URL: redis://, rediss://, redis+cluster://host:port,host:port, redis+sentinel://master@host:port,host:port/db"}, str(func(c *Config) *string { return &c.RedisURL })},
		{Option{"key-prefix", "GRID_KEY_PREFIX", d.KeyPrefix, "registry key prefix; must match the Caddy side"}, str(func(c *Config) *string { return &c.KeyPrefix })},
		{Option{"pool", "POOL", "the browser type", "pool to register in"}, str(func(c *Config) *string { return &c.Pool })},
		{Option{"browser-type", "BROWSER_TYPE", d.BrowserType, "chromium, firefox or webkit"}, str(func(c *Config) *string { return &c.BrowserType })},
		{Option{"launcher", "LAUNCHER", d.Launcher, "playwright, playwright-server, cdp, exec or fake"}, str(func(c *Config) *string { return &c.Launcher })},
		{Option{"advertise", "PRIVATE_HOSTNAME", "-host:-port", "host or host:port proxies dial (a bare host takes the agent's port)"}, str(func(c *Config) *string { return &c.Advertise })},
		{Option{"host", "GRID_WORKER_HOST", d.Host, "address the agent listens on for proxies (0.0.0.0 in containers); the browser listens on loopback only"}, str(func(c *Config) *string { return &c.Host })},
		{Option{"port", "GRID_WORKER_PORT", "0", "the agent's port (0: a free port)"}, num(func(c *Config) *int { return &c.Port })},
		{Option{"ws-path", "WS_PATH", d.WSPath, "WebSocket path (playwright and fake launchers)"}, str(func(c *Config) *string { return &c.WSPath })},
		{Option{"max-concurrent", "MAX_CONCURRENT_SESSIONS", "0", "sessions the worker takes at once, registered as its capacity (0: no limit of its own)"}, num(func(c *Config) *int { return &c.MaxConcurrent })},
		{Option{"virtual-nodes", "VIRTUAL_NODES", "0", "ring positions for the vnode policy (0: the registry's default, 8)"}, num(func(c *Config) *int { return &c.VirtualNodes })},
		{Option{"weight", "WORKER_WEIGHT", "0", "turns in each round of the interleaved_weighted_round_robin policy, 0-10000 (0: its -max-concurrent, or 1)"}, num(func(c *Config) *int { return &c.Weight })},
		{Option{"heartbeat-interval", "HEARTBEAT_INTERVAL", "10s", "how often to report the browsers' sessions and counts"}, dur(func(c *Config) *time.Duration { return &c.HeartbeatInterval })},
		{Option{"stale-threshold", "STALE_THRESHOLD", "30s", "Caddy's stale_threshold, checked against the heartbeat"}, dur(func(c *Config) *time.Duration { return &c.StaleThreshold })},
		{Option{"drain-timeout", "DRAIN_TIMEOUT", "30s", "longest wait for a retiring browser's sessions; those left are closed"}, dur(func(c *Config) *time.Duration { return &c.DrainTimeout })},
		{Option{"proxy-timeout", "PROXY_TIMEOUT", "15s", "how long a proxy's connection may stop answering before its session ends (TCP keepalive and user timeout)"}, dur(func(c *Config) *time.Duration { return &c.ProxyTimeout })},
		{Option{"probe-timeout", "PROBE_TIMEOUT", "5s", "timeout of the browser probe run every heartbeat (0: no probe)"}, dur(func(c *Config) *time.Duration { return &c.ProbeTimeout })},
		{Option{"probe-failures", "PROBE_FAILURES", "3", "probes in a row that must fail before the browser is restarted with its sessions"}, num(func(c *Config) *int { return &c.ProbeFailures })},
		{Option{"start-timeout", "START_TIMEOUT", "60s", "longest wait for a launched browser's endpoint"}, dur(func(c *Config) *time.Duration { return &c.StartTimeout })},
		{Option{"redis-retry-attempts", "REDIS_RETRY_ATTEMPTS", "10", "tries to reach Redis at start before giving up"}, num(func(c *Config) *int { return &c.RedisRetryAttempts })},
		{Option{"redis-retry-delay", "REDIS_RETRY_DELAY", "1s", "first wait between those tries (doubles up to 5s)"}, dur(func(c *Config) *time.Duration { return &c.RedisRetryDelay })},
		{Option{"respawn", "RESPAWN", "false", "after a drain or a crash start a fresh browser and register anew instead of exiting"}, func(c *Config, v string) error {
			b, err := strconv.ParseBool(strings.TrimSpace(v))
			if err != nil {
				return fmt.Errorf("not a boolean (true or false)")
			}
			c.Respawn = b
			return nil
		}},
		{Option{"respawn-max-backoff", "RESPAWN_MAX_BACKOFF", "30s", "cap of the crash backoff (starts at 1s, doubles)"}, dur(func(c *Config) *time.Duration { return &c.RespawnMaxBackoff })},
		{Option{"executable", "BROWSER_EXECUTABLE", "/usr/bin/chromium for chromium", "browser binary (firefox, webkit: Playwright's own build)"}, str(func(c *Config) *string { return &c.Executable })},
		{Option{"node", "NODE", d.Node, "node binary for the playwright launchers"}, str(func(c *Config) *string { return &c.Node })},
		{Option{"headless-shell", "BROWSER_HEADLESS_SHELL", "chromium-headless-shell unless -executable is set", "Chromium's headless shell, for the playwright launchers' headless browsers (none: -executable)"}, str(func(c *Config) *string { return &c.HeadlessShell })},
		{Option{"ffmpeg", "FFMPEG", d.FFmpeg, "ffmpeg for the playwright launchers' videos (none: no video)"}, str(func(c *Config) *string { return &c.FFmpeg })},
		{Option{"disk-max", "DISK_MAX", "2048", "MB a browser's temporary files (videos, traces, downloads) may take before it retires (0: no bound)"}, func(c *Config, v string) error {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || n < 0 {
				return fmt.Errorf("not a whole number of MB")
			}
			c.DiskMax = n << 20
			return nil
		}},
		{Option{"launch-script", "PLAYWRIGHT_LAUNCH_SCRIPT", "playwright/launch-server.mjs beside the binary", "the playwright launchers' script"}, str(func(c *Config) *string { return &c.LaunchScript })},
		{Option{"playwright-version", "PLAYWRIGHT_VERSION", "the newest installed", "playwright-core major.minor the playwright launchers load (e.g. 1.64)"}, str(func(c *Config) *string { return &c.PlaywrightVersion })},
		{Option{"exec", "EXEC_COMMAND", "", "command for the exec launcher (sh -c); prints its ws:// endpoint"}, str(func(c *Config) *string { return &c.Exec })},
		{Option{"fakebrowser", "FAKEBROWSER", "beside the binary, else PATH", "fakebrowser binary for the fake launcher"}, str(func(c *Config) *string { return &c.Fakebrowser })},
		{Option{"fake-args", "FAKEBROWSER_ARGS", "", "extra fakebrowser flags, space-separated"}, str(func(c *Config) *string { return &c.FakeArgs })},
		{Option{"worker-secret", "GRID_WORKER_SECRET", "", "sign the record with this secret (Caddy's worker_secret); prefer the environment variable"}, str(func(c *Config) *string { return &c.WorkerSecret })},
		{Option{"id-prefix", "WORKER_ID_PREFIX", "the hostname", "start of every worker ID (<prefix>-<pid>-<random>)"}, str(func(c *Config) *string { return &c.IDPrefix })},
		{Option{"log-format", "LOG_FORMAT", d.LogFormat, "json or console"}, str(func(c *Config) *string { return &c.LogFormat })},
		{Option{"log-level", "LOG_LEVEL", d.LogLevel, "debug, info, warn or error"}, str(func(c *Config) *string { return &c.LogLevel })},
	}
}

// Options lists every setting with its flag, environment variable, default
// and meaning, in the order of -help.
func Options() []Option {
	bs := bindings()
	out := make([]Option, len(bs))
	for i, b := range bs {
		out[i] = b.Option
	}
	return out
}

// ParseDuration reads a Go duration ("500ms", "1m30s") or a bare number of
// seconds ("10", as the seed's environment variables are written).
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("not a duration (like 10s, 500ms, or a number of seconds)")
	}
	return d, nil
}

// flagValue adapts a binding to flag.Value.
type flagValue struct {
	c *Config
	b binding
}

func (f flagValue) String() string { return "" }
func (f flagValue) Set(v string) error {
	return f.b.set(f.c, v)
}

type boolFlag struct{ flagValue }

func (boolFlag) IsBoolFlag() bool { return true }

// ErrHelp is returned by ParseFlags when -help was asked for.
var ErrHelp = flag.ErrHelp

// ParseFlags builds a Config from defaults, then environment variables
// (getenv, usually os.Getenv), then flags, and validates it. Usage and
// errors go to out. Any error means "exit 2".
func ParseFlags(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	c := Defaults()
	bs := bindings()
	for _, b := range bs {
		if v := getenv(b.Env); v != "" {
			if err := b.set(&c, v); err != nil {
				return c, fmt.Errorf("environment variable %s=%q: %w", b.Env, v, err)
			}
		}
	}
	fs := flag.NewFlagSet("grid-worker", flag.ContinueOnError)
	fs.SetOutput(out)
	for _, b := range bs {
		usage := fmt.Sprintf("%s (env %s, default %s)", b.Usage, b.Env, b.Default)
		if b.Default == "" {
			usage = fmt.Sprintf("%s (env %s)", b.Usage, b.Env)
		}
		if b.Flag == "respawn" {
			fs.Var(boolFlag{flagValue{&c, b}}, b.Flag, usage)
			continue
		}
		fs.Var(flagValue{&c, b}, b.Flag, usage)
	}
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: grid-worker [flags]\n\nLaunches a browser, fronts it (every session's connection passes through\nthe agent), registers it in the grid's Redis, reports its sessions, drains\nit at its lifetime, on an operator's drain or on SIGTERM, and exits (or\nstarts the next browser with -respawn). A stop on SIGTERM takes at most\n-drain-timeout + %s: give the supervisor longer than that.\n\n", StopMargin)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q (every setting is a -flag)", fs.Args())
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c, nil
}

// Validate checks the configuration, the worker lifecycle's timing relationships first;
// each error names the rule and the values.
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"heartbeat-interval", c.HeartbeatInterval}, {"stale-threshold", c.StaleThreshold}, {"drain-timeout", c.DrainTimeout}, {"proxy-timeout", c.ProxyTimeout}, {"start-timeout", c.StartTimeout}, {"redis-retry-delay", c.RedisRetryDelay}, {"respawn-max-backoff", c.RespawnMaxBackoff}} {
		if d.v <= 0 {
			add("-%s must be positive, got %s", d.name, d.v)
		}
	}
	if c.ProbeTimeout < 0 {
		add("-probe-timeout must not be negative, got %s", c.ProbeTimeout)
	}
	if c.ProbeFailures < 1 {
		add("-probe-failures must be at least 1, got %d", c.ProbeFailures)
	}
	if c.HeartbeatInterval > 0 && c.StaleThreshold > 0 && c.HeartbeatInterval >= c.StaleThreshold {
		// The worker lifecycle, "Timing Relationships".
		add("timing rule 'heartbeat interval < stale threshold' broken: heartbeat-interval %s >= stale-threshold %s (Caddy would skip and remove a healthy worker)", c.HeartbeatInterval, c.StaleThreshold)
	}
	if c.ProxyTimeout > 0 && c.ProxyTimeout < 3*time.Second {
		add("-proxy-timeout must be at least 3s (TCP keepalive probes are whole seconds), got %s", c.ProxyTimeout)
	}
	switch c.BrowserType {
	case "chromium", "firefox", "webkit":
	default:
		add("-browser-type must be chromium, firefox or webkit, got %q", c.BrowserType)
	}
	if c.PlaywrightVersion != "" {
		if err := registry.CheckVersion(c.PlaywrightVersion); err != nil {
			add("-playwright-version: %v", err)
		} else if c.Launcher != LauncherPlaywright && c.Launcher != LauncherPlaywrightServer {
			add("-playwright-version picks the playwright launchers' playwright-core, but -launcher is %q", c.Launcher)
		}
	}
	switch c.Launcher {
	case LauncherPlaywright, LauncherPlaywrightServer, LauncherFake:
	case LauncherCDP:
		if c.BrowserType != "chromium" {
			add("-launcher cdp runs Chromium only, but -browser-type is %q", c.BrowserType)
		}
	case LauncherExec:
		if strings.TrimSpace(c.Exec) == "" {
			add("-launcher exec needs -exec (the command that prints its ws:// endpoint)")
		}
	default:
		add("-launcher must be playwright, playwright-server, cdp, exec or fake, got %q", c.Launcher)
	}
	if c.Pool == "" {
		c.Pool = c.BrowserType
	}
	if c.Launcher == LauncherCDP && c.MaxConcurrent == 0 {
		// A CDP session drives the whole browser: it sees and can close
		// every other session's pages. One at a time, unless the operator
		// says more.
		c.MaxConcurrent = 1
	}
	if !validName(c.Pool) {
		add("-pool %q: use letters, digits, '.', '_' and '-' only", c.Pool)
	}
	// The longest ID the agent makes from the prefix (a 7-digit pid)
	// must be one the registry takes, or every registration would fail.
	if err := registry.CheckID(idPrefix(c.IDPrefix) + "-4194304-00000000"); err != nil {
		if c.IDPrefix == "" {
			add("-id-prefix is empty and the hostname %q, used instead, makes worker IDs the registry refuses (%v): set -id-prefix", idPrefix(""), err)
		} else {
			add("-id-prefix %q makes worker IDs the registry refuses: %v (an ID is the prefix, then -<pid>-<8 hex digits>)", c.IDPrefix, err)
		}
	}
	if c.Port < 0 || c.Port > 65535 {
		add("-port must be 0..65535, got %d", c.Port)
	}
	if !strings.HasPrefix(c.WSPath, "/") {
		add("-ws-path must start with '/', got %q", c.WSPath)
	}
	if err := selection.ValidWeight(c.Weight); err != nil {
		add("-weight: %v", err)
	}
	if c.MaxConcurrent < 0 {
		add("-max-concurrent must not be negative, got %d", c.MaxConcurrent)
	}
	if c.VirtualNodes < 0 || c.VirtualNodes > registry.MaxVirtualNodes {
		add("-virtual-nodes must be 0..%d, got %d", registry.MaxVirtualNodes, c.VirtualNodes)
	}
	if c.RedisRetryAttempts < 1 {
		add("-redis-retry-attempts must be at least 1, got %d", c.RedisRetryAttempts)
	}
	if c.Advertise != "" {
		if _, _, err := splitAdvertise(c.Advertise); err != nil {
			add("-advertise %q: %v", c.Advertise, err)
		}
	}
	switch c.LogFormat {
	case "json", "console":
	default:
		add("-log-format must be json or console, got %q", c.LogFormat)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		add("-log-level must be debug, info, warn or error, got %q", c.LogLevel)
	}
	if c.RedisURL == "" {
		add("-redis is required")
	}
	if c.KeyPrefix == "" {
		add("-key-prefix must not be empty")
	} else if err := registry.CheckPrefix(c.KeyPrefix); err != nil {
		add("-key-prefix: %v", err)
	}
	return errors.Join(errs...)
}

func validName(s string) bool {
	if s == "" || len(s) > 200 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Interface guards.
var (
	_ flag.Value = flagValue{}
	_ flag.Value = boolFlag{}
)

// splitAdvertise splits -advertise into its host and port ("" when it
// names a host only, to take the browser's port). A bare IPv6 address may
// come with or without brackets. It refuses what Caddy would never dial
// (see caddygrid's dial policy): a zone, a port that is not all digits, a
// host with a colon that is no IP address (a typo such as "10.0.0.7::9000").
func splitAdvertise(adv string) (host, port string, err error) {
	if !utf8.ValidString(adv) || strings.ContainsFunc(adv, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return "", "", fmt.Errorf("not valid UTF-8, or holds spaces or control characters")
	}
	if h, p, err := net.SplitHostPort(adv); err == nil {
		if p == "" {
			return "", "", fmt.Errorf("empty port after ':' (want host or host:port)")
		}
		host, port = h, p
	} else if strings.HasPrefix(adv, "[") && strings.HasSuffix(adv, "]") {
		host = adv[1 : len(adv)-1]
		if a, err := netip.ParseAddr(host); err != nil || !a.Is6() {
			return "", "", fmt.Errorf("brackets hold an IPv6 address, not %q", host)
		}
	} else {
		host = adv
	}
	switch {
	case host == "":
		return "", "", fmt.Errorf("no host")
	case strings.Contains(host, "%"):
		return "", "", fmt.Errorf("a zoned address (%%) is never dialed by Caddy's dial policy")
	case strings.ContainsAny(host, "/[]@?#{}"):
		return "", "", fmt.Errorf("want host or host:port")
	case strings.Contains(host, ":") && net.ParseIP(host) == nil:
		return "", "", fmt.Errorf("%q is neither host:port nor an IPv6 address", adv)
	}
	if port != "" {
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 || strings.Trim(port, "0123456789") != "" {
			return "", "", fmt.Errorf("port must be 1..65535")
		}
	}
	return host, port, nil
}
