package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client defaults. Each applies only when the URL does not set the option
// itself (?dial_timeout=, ?read_timeout=, ...); a URL value of 0 or less
// disables it as go-redis documents.
const (
	// DefaultDialTimeout bounds one TCP (and TLS) connect attempt.
	// go-redis' own default is 5 s; a Redis that does not accept within
	// 2 s is treated as down.
	DefaultDialTimeout = 2 * time.Second
	// DefaultReadTimeout and DefaultWriteTimeout bound one command on a
	// connection when the caller's context has no earlier deadline (the
	// context's deadline always applies: ContextTimeoutEnabled is set on
	// every client). go-redis' own default is 5 s.
	DefaultReadTimeout  = 3 * time.Second
	DefaultWriteTimeout = 3 * time.Second
	// DefaultPoolTimeout bounds the wait for a free pooled connection.
	DefaultPoolTimeout = 3 * time.Second
	// DefaultMaxRetries bounds the retries of one command (retryGuard says
	// which are retried), each after a backoff doubling from
	// DefaultMinRetryBackoff up to DefaultMaxRetryBackoff.
	DefaultMaxRetries      = 3
	DefaultMinRetryBackoff = 8 * time.Millisecond
	DefaultMaxRetryBackoff = 256 * time.Millisecond
	// clusterStateRefresh is the longest a Cluster client keeps its slot
	// map without reloading it while traffic succeeds (go-redis: 60 s). A
	// failed call reloads it at once (see retryGuard).
	clusterStateRefresh = 10 * time.Second
)

// newClient implements NewClient.
//
//	redis://[user:password@]host:port[/db][?options]
//	rediss://...                                (TLS)
//	redis+cluster://[user:password@]h1:p1,h2:p2[?options]
//	rediss+cluster://...                        (Cluster over TLS)
//	redis+sentinel://[user:password@]master@h1:p1,h2:p2[/db][?options]
//	rediss+sentinel://...                       (Sentinel and data nodes over TLS)
//	unix://[user:password@]/path/to/redis.sock[?db=N]
//
// Options are go-redis' URL options (dial_timeout, pool_size, ...). With
// Sentinel, user:password authenticate to the data nodes (master and
// replicas), like every other form; the sentinels' own credentials, when
// they have any, are the options sentinel_username and sentinel_password.
//
// Every client honours its caller's context deadline (go-redis'
// ContextTimeoutEnabled) and gets the Default* timeouts above unless the
// URL sets them. Retries: see retryGuard.
func newClient(raw string) (redis.UniversalClient, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("parsing redis URL %q: no scheme (want redis://, rediss://, redis+cluster://, redis+sentinel:// or unix://)", RedactURL(raw))
	}
	bad := func(err error) error {
		return fmt.Errorf("parsing redis URL %q: %s", RedactURL(raw), redactErr(err, raw))
	}
	switch strings.ToLower(scheme) {
	case "redis", "rediss", "unix":
		opts, err := redis.ParseURL(raw)
		if err != nil {
			return nil, bad(err)
		}
		g := newRetryGuard(opts.MaxRetries)
		opts.MaxRetries = g.goRedisRetries()
		opts.ContextTimeoutEnabled = true
		g.defaults(&opts.DialTimeout, &opts.ReadTimeout, &opts.WriteTimeout, &opts.PoolTimeout,
			&opts.MinRetryBackoff, &opts.MaxRetryBackoff)
		c := redis.NewClient(opts)
		c.AddHook(g)
		return c, nil
	case "redis+cluster", "rediss+cluster":
		return newClusterClient(raw, scheme, rest, bad)
	case "redis+sentinel", "rediss+sentinel":
		return newSentinelClient(raw, scheme, rest, bad)
	default:
		return nil, fmt.Errorf("parsing redis URL %q: unsupported scheme %q (want redis, rediss, redis+cluster, rediss+cluster, redis+sentinel, rediss+sentinel or unix)", RedactURL(raw), scheme)
	}
}

// multiHostURL is a URL with a list of hosts: the cluster and sentinel
// forms.
type multiHostURL struct {
	userinfo string // "user:password@" or ""
	prefix   string // sentinel: the master name
	hosts    []string
	path     string // without the leading "/"
	query    url.Values
}

// splitMultiHost splits rest (the URL after "://"). withPrefix: the
// authority is "[userinfo@]prefix@hosts" (Sentinel's master name).
func splitMultiHost(rest string, withPrefix bool) (multiHostURL, error) {
	var m multiHostURL
	authority, tail, _ := strings.Cut(rest, "/")
	query := ""
	if i := strings.IndexByte(authority, '?'); i >= 0 {
		authority, query = authority[:i], authority[i+1:]
	} else if i := strings.IndexByte(tail, '?'); i >= 0 {
		tail, query = tail[:i], tail[i+1:]
	}
	m.path = tail
	hostList := authority
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		m.userinfo, hostList = authority[:i+1], authority[i+1:]
	}
	if withPrefix {
		before := strings.TrimSuffix(m.userinfo, "@")
		m.userinfo = ""
		if i := strings.LastIndexByte(before, '@'); i >= 0 {
			m.userinfo, before = before[:i+1], before[i+1:]
		}
		if before == "" || strings.Contains(before, ":") {
			return m, errors.New("no master name: want redis+sentinel://[user:password@]master-name@host:port,...")
		}
		name, err := url.PathUnescape(before)
		if err != nil {
			return m, fmt.Errorf("master name: %w", err)
		}
		m.prefix = name
	}
	m.hosts = strings.Split(hostList, ",")
	for _, h := range m.hosts {
		if h == "" {
			return m, fmt.Errorf("empty host in the list %q", hostList)
		}
	}
	m.query = url.Values{}
	if query != "" {
		q, err := url.ParseQuery(query)
		if err != nil {
			return m, fmt.Errorf("query: %w", err)
		}
		m.query = q
	}
	return m, nil
}

func newClusterClient(raw, scheme, rest string, bad func(error) error) (redis.UniversalClient, error) {
	base := strings.TrimSuffix(strings.ToLower(scheme), "+cluster")
	m, err := splitMultiHost(rest, false)
	if err != nil {
		return nil, bad(err)
	}
	if m.path != "" {
		return nil, fmt.Errorf("parsing redis URL %q: Redis Cluster has no databases, remove the path %q", RedactURL(raw), "/"+m.path)
	}
	q := m.query
	for _, h := range m.hosts[1:] {
		q.Add("addr", h)
	}
	u := base + "://" + m.userinfo + m.hosts[0]
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	opts, err := redis.ParseClusterURL(u)
	if err != nil {
		return nil, bad(err)
	}
	// ClusterOptions.MaxRetries is the node clients' own retry count
	// (go-redis: none, the cluster loop retries); the guard's bound is
	// max_retries when the URL sets it.
	g := newRetryGuard(opts.MaxRetries)
	opts.ContextTimeoutEnabled = true
	g.defaults(&opts.DialTimeout, &opts.ReadTimeout, &opts.WriteTimeout, &opts.PoolTimeout,
		&opts.MinRetryBackoff, &opts.MaxRetryBackoff)
	// Writes and scripts must reach the slot's master; reads too, so that
	// a read never sees a replica behind the master it just wrote.
	opts.ReadOnly, opts.RouteByLatency, opts.RouteRandomly = false, false, false
	opts.ClusterStateReloadInterval = clusterStateRefresh
	c := redis.NewClusterClient(opts)
	g.reload = func() { c.ReloadState(context.Background()) }
	c.AddHook(g)
	return c, nil
}

func newSentinelClient(raw, scheme, rest string, bad func(error) error) (redis.UniversalClient, error) {
	m, err := splitMultiHost(rest, true)
	if err != nil {
		return nil, bad(err)
	}
	if strings.Contains(m.path, "/") {
		return nil, fmt.Errorf("parsing redis URL %q: the path is the database number, not %q", RedactURL(raw), "/"+m.path)
	}
	// go-redis' ParseFailoverURL reads the userinfo as the sentinels'
	// credentials and ?username=&password= as the data nodes'; this URL
	// form gives the userinfo to the data nodes (as redis:// does), so the
	// two are swapped here.
	q := m.query
	for _, k := range []string{"master_name", "addr", "username", "password"} {
		if q.Has(k) {
			return nil, fmt.Errorf("parsing redis URL %q: option %s is not accepted here (the master name, hosts and credentials go in the URL's authority)", RedactURL(raw), k)
		}
	}
	sentinelUser, sentinelPass := q.Get("sentinel_username"), q.Get("sentinel_password")
	q.Del("sentinel_username")
	q.Del("sentinel_password")
	if m.userinfo != "" {
		ui, err := url.Parse("redis://" + m.userinfo + "h")
		if err != nil {
			return nil, bad(fmt.Errorf("user info: %w", err))
		}
		q.Set("username", ui.User.Username())
		if p, ok := ui.User.Password(); ok {
			q.Set("password", p)
		}
	}
	q.Set("master_name", m.prefix)
	for _, h := range m.hosts[1:] {
		q.Add("addr", h)
	}
	base := strings.TrimSuffix(strings.ToLower(scheme), "+sentinel")
	ui := ""
	if sentinelUser != "" || sentinelPass != "" {
		ui = url.UserPassword(sentinelUser, sentinelPass).String() + "@"
	}
	u := base + "://" + ui + m.hosts[0]
	if m.path != "" {
		u += "/" + m.path
	}
	u += "?" + q.Encode()
	opts, err := redis.ParseFailoverURL(u)
	if err != nil {
		return nil, bad(err)
	}
	if opts.TLSConfig != nil {
		// One TLS config serves sentinels and data nodes: their names differ,
		// so verify each against the host it dials (crypto/tls does so when
		// ServerName is empty and the dialer passes the address).
		opts.TLSConfig.ServerName = ""
	}
	g := newRetryGuard(opts.MaxRetries)
	opts.MaxRetries = g.goRedisRetries()
	opts.ContextTimeoutEnabled = true
	g.defaults(&opts.DialTimeout, &opts.ReadTimeout, &opts.WriteTimeout, &opts.PoolTimeout,
		&opts.MinRetryBackoff, &opts.MaxRetryBackoff)
	c := redis.NewFailoverClient(opts)
	c.AddHook(g)
	return c, nil
}

// defaults fills the settings the URL left unset (0) with the package's
// defaults and adopts the backoff for the guard's own retries.
func (g *retryGuard) defaults(dial, read, write, pool, minBackoff, maxBackoff *time.Duration) {
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{dial, DefaultDialTimeout}, {read, DefaultReadTimeout}, {write, DefaultWriteTimeout},
		{pool, DefaultPoolTimeout}, {minBackoff, DefaultMinRetryBackoff}, {maxBackoff, DefaultMaxRetryBackoff},
	} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	g.minBackoff, g.maxBackoff = max(*minBackoff, 0), max(*maxBackoff, 0)
}

// retryGuard is the retry policy of every client NewClient returns. go-redis
// retries a command after any network error, including a connection that
// dropped or timed out after the command was written: the command may have
// run, and a script that claims a slot would then claim twice. So:
//
//   - Scripts (EVAL, EVALSHA, their _RO forms, FCALL) reach go-redis marked
//     "no retry", and the guard retries one only when the error proves it
//     did not run: the connection was never made (a dial error, no free
//     pooled connection), or Redis refused it before running it (LOADING,
//     MASTERDOWN, READONLY, TRYAGAIN, CLUSTERDOWN, NOREPLICAS, too many
//     clients). After a timeout, a dropped connection or a reset, the error
//     goes back to the caller, who decides (a lease nobody renews expires).
//     "ERR Function not found" (the library is not loaded on that node) also
//     goes back as it is: the function did not exist, so it never ran, and
//     the registry's caller (Registry.fcall) loads the library on that node
//     and calls once more.
//     With Cluster, MOVED and ASK are still followed (the node refused the
//     script without running it).
//   - Other commands keep go-redis' retries, bounded by max_retries with
//     backoff: the registry's plain commands are idempotent (SADD of a pool
//     name, SMEMBERS, the reaper lock's SET NX, whose repeat only reports
//     "not taken").
//
// With Cluster, every failed call that may come from a moved slot or a dead
// node also reloads the slot map (go-redis reloads it only on MOVED, or every
// 60 s), so a replica's promotion is picked up at the next failed call.
type retryGuard struct {
	retries    int // retries of a script that did not run
	minBackoff time.Duration
	maxBackoff time.Duration
	reload     func() // Cluster: reload the slot map (coalesced by go-redis)
}

// newRetryGuard takes the URL's max_retries (0: unset, -1: none).
func newRetryGuard(urlRetries int) *retryGuard {
	g := &retryGuard{retries: DefaultMaxRetries}
	switch {
	case urlRetries < 0:
		g.retries = 0
	case urlRetries > 0:
		g.retries = urlRetries
	}
	return g
}

// goRedisRetries is go-redis' MaxRetries for the same bound (-1: none).
func (g *retryGuard) goRedisRetries() int {
	if g.retries == 0 {
		return -1
	}
	return g.retries
}

// backoff is the pause before retry n (1, 2, ...): doubling from
// minBackoff, capped at maxBackoff.
func (g *retryGuard) backoff(n int) time.Duration {
	d := g.minBackoff << min(n-1, 16)
	if d > g.maxBackoff || d <= 0 {
		d = g.maxBackoff
	}
	return d
}

func (g *retryGuard) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *retryGuard) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err != nil && g.reload != nil && topologyError(err) {
			g.reload()
		}
		return err
	}
}

func (g *retryGuard) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		script := isScript(cmd.Name())
		run := cmd
		if script {
			run = noRetryCmd{cmd}
		}
		for attempt := 0; ; attempt++ {
			err := next(ctx, run)
			if err == nil {
				return nil
			}
			if g.reload != nil && topologyError(err) {
				g.reload()
			}
			if !script || attempt >= g.retries || !notRun(err) || ctx.Err() != nil {
				return err
			}
			t := time.NewTimer(g.backoff(attempt + 1))
			select {
			case <-ctx.Done():
				t.Stop()
				return err
			case <-t.C:
			}
		}
	}
}

// noRetryCmd is a command go-redis must not send twice: its own retry loops
// (single node, Sentinel, and Cluster's) give up at the first error when
// NoRetry is true. Embedding the interface keeps every other method, so the
// reply still lands in the caller's command.
type noRetryCmd struct{ redis.Cmder }

func (noRetryCmd) NoRetry() bool { return true }

// isScript reports whether a command runs a script or function.
func isScript(name string) bool {
	switch strings.ToLower(name) {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
		return true
	}
	return false
}

// notRun reports whether err proves the command never ran: no connection
// was made, or Redis refused it with an error that it returns before
// running anything.
func notRun(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	if errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) {
		return true
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	for _, p := range []string{"LOADING ", "MASTERDOWN ", "READONLY ", "TRYAGAIN ", "CLUSTERDOWN ", "NOREPLICAS ", "ERR max number of clients reached"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// topologyError reports whether err may mean that a Cluster node died or
// lost its slots: then the slot map is worth reloading. Timeouts count (a
// host that vanished without a reset only ever times out); go-redis
// coalesces the reloads, so a stalled node costs one CLUSTER SLOTS every
// few hundred milliseconds at most.
func topologyError(err error) bool {
	if errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		return strings.HasPrefix(msg, "CLUSTERDOWN ") || strings.HasPrefix(msg, "READONLY ") ||
			strings.HasPrefix(msg, "MASTERDOWN ") || strings.HasPrefix(msg, "TRYAGAIN ")
	}
	return strings.Contains(err.Error(), "connection refused")
}

// redactURL implements RedactURL. It works on the text rather than through
// net/url so that cluster host lists ("h1:1,h2:2") and malformed URLs are
// redacted too.
func redactURL(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		if strings.Contains(raw, "@") {
			return "xxxxx@" + raw[strings.LastIndexByte(raw, '@')+1:]
		}
		return raw
	}
	end := strings.IndexAny(rest, "/?")
	if end < 0 {
		end = len(rest)
	}
	authority := rest[:end]
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		userinfo, hosts := authority[:at], authority[at:]
		master := ""
		if strings.HasSuffix(strings.ToLower(scheme), "+sentinel") {
			// [user:password@]master@hosts: the master name stays.
			master = userinfo
			userinfo = ""
			if i := strings.LastIndexByte(master, '@'); i >= 0 {
				userinfo, master = master[:i], master[i:]
			} else if strings.Contains(master, ":") {
				// No master name: "user:password@hosts" (NewClient refuses it).
				userinfo, master = master, ""
			}
		}
		// A lone userinfo is a user name (go-redis reads it so), not a secret.
		if user, _, hasPass := strings.Cut(userinfo, ":"); hasPass {
			userinfo = user + ":xxxxx"
		}
		authority = userinfo + master + hosts
	}
	tail := rest[end:]
	if i := strings.IndexByte(tail, '?'); i >= 0 {
		q, err := url.ParseQuery(tail[i+1:])
		secret := func(k string) bool { return strings.Contains(strings.ToLower(k), "password") }
		if err == nil {
			changed := false
			for k := range q {
				if secret(k) {
					q[k] = []string{"xxxxx"}
					changed = true
				}
			}
			if changed {
				tail = tail[:i+1] + q.Encode()
			}
		} else if strings.Contains(strings.ToLower(tail[i+1:]), "password") {
			tail = tail[:i+1] + "xxxxx"
		}
	}
	return scheme + "://" + authority + tail
}

// redactErr removes any secret of raw that an error message might repeat.
func redactErr(err error, raw string) string {
	msg := err.Error()
	var secrets []string
	if u, perr := url.Parse(raw); perr == nil {
		if u.User != nil {
			if p, ok := u.User.Password(); ok {
				secrets = append(secrets, p)
			}
		}
		for k, vs := range u.Query() {
			if strings.Contains(strings.ToLower(k), "password") {
				secrets = append(secrets, vs...)
			}
		}
	}
	// Multi-host and sentinel URLs do not parse as one URL: take what
	// stands between the scheme and the last '@' of the authority.
	if _, rest, ok := strings.Cut(raw, "://"); ok {
		authority, _, _ := strings.Cut(rest, "/")
		if at := strings.LastIndexByte(authority, '@'); at >= 0 {
			if _, pass, ok := strings.Cut(authority[:at], ":"); ok {
				secrets = append(secrets, pass)
				if i := strings.LastIndexByte(pass, '@'); i >= 0 {
					secrets = append(secrets, pass[:i])
				}
				if p, err := url.PathUnescape(pass); err == nil {
					secrets = append(secrets, p)
				}
			}
		}
	}
	msg = strings.ReplaceAll(msg, raw, RedactURL(raw))
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	return msg
}
