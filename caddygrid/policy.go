package caddygrid

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

// The policy seam: every grid selection policy is one Caddy module, a
// Policy of its kind. A kind names its row of the registry's policy table
// and the options of its own; adding a policy is its selection/ file, its
// Lua walk, its row, and one kind here (docs/adding-a-policy.md).

func init() {
	caddy.RegisterModule(Policy[lifetimeFirst]{})
	caddy.RegisterModule(Policy[vnode]{})
	caddy.RegisterModule(Policy[fairShare]{})
	caddy.RegisterModule(Policy[interleavedWeightedRoundRobin]{})
}

// policyKind is what a policy adds to the claim every policy makes.
type policyKind interface {
	// name is its row of registry.Policies.
	name() registry.Policy
	// own lists the PolicyOptions it takes.
	own() []string
	// staggers says whether stagger_drains is on by default.
	staggers() bool
	// options encodes its options for the registry (nil: none).
	options(o PolicyOptions) registry.PolicyOptions
}

type lifetimeFirst struct{}

func (lifetimeFirst) name() registry.Policy                        { return registry.LifetimeFirst }
func (lifetimeFirst) own() []string                                { return nil }
func (lifetimeFirst) staggers() bool                               { return true }
func (lifetimeFirst) options(PolicyOptions) registry.PolicyOptions { return nil }

type vnode struct{}

func (vnode) name() registry.Policy { return registry.Vnode }
func (vnode) own() []string         { return []string{"samples", "slot_jitter"} }
func (vnode) staggers() bool        { return false }
func (vnode) options(o PolicyOptions) registry.PolicyOptions {
	v := registry.VnodeOptions{Samples: o.Samples, SlotJitter: selection.DefaultSlotJitter}
	if v.Samples == 0 {
		v.Samples = selection.DefaultSamples
	}
	if o.SlotJitter != nil {
		v.SlotJitter = *o.SlotJitter
	}
	return v
}

type fairShare struct{}

func (fairShare) name() registry.Policy { return registry.FairShare }
func (fairShare) own() []string         { return []string{"window", "median", "default_estimate"} }
func (fairShare) staggers() bool        { return false }
func (fairShare) options(o PolicyOptions) registry.PolicyOptions {
	f := registry.FairShareOptions{Window: o.Window, Median: o.Median, Default: time.Duration(o.DefaultEstimate)}
	if f.Window == 0 {
		f.Window = selection.DefaultWindow
	}
	if f.Default == 0 {
		f.Default = selection.DefaultEstimate
	}
	return f
}

type interleavedWeightedRoundRobin struct{}

func (interleavedWeightedRoundRobin) name() registry.Policy {
	return registry.InterleavedWeightedRoundRobin
}
func (interleavedWeightedRoundRobin) own() []string                                { return nil }
func (interleavedWeightedRoundRobin) staggers() bool                               { return false }
func (interleavedWeightedRoundRobin) options(PolicyOptions) registry.PolicyOptions { return nil }

// Defaults of the options every policy shares.
const (
	// DefaultSelectTimeout is how long a request waits for a free worker.
	DefaultSelectTimeout = 5 * time.Second
	// DefaultQueueSize bounds the requests waiting per pool.
	DefaultQueueSize = 100
	// DefaultMaxScan bounds the unusable workers one decision walks past.
	DefaultMaxScan = selection.DefaultVnodeMaxScan
	// DefaultClientKey names a client by its IP address ({client_ip}).
	DefaultClientKey = "{http.vars.client_ip}"
)

// Limits are one claim's limits: they travel with the claim to the
// agent, which holds them (docs/design.md).
type Limits struct {
	registry.Limits
	// MaxSession and IdleTimeout end a session when they pass (0: never).
	MaxSession  time.Duration
	IdleTimeout time.Duration
}

// ClaimOptions are the options every grid policy shares. In the
// browser_grid directive they are options of the directive; in a
// hand-composed reverse_proxy they go in the lb_policy block.
type ClaimOptions struct {
	// MaxConcurrent caps a worker's live sessions; its own capacity applies
	// too (the smaller wins). 0: only the worker's. Default: 0.
	MaxConcurrent int `json:"max_concurrent,omitempty"`
	// MaxLifetime is the sessions after which a worker retires and its
	// agent restarts it. 0: never. Default: 0.
	MaxLifetime int `json:"max_lifetime,omitempty"`
	// StaggerDrains holds a worker's last session while another worker of
	// its group retires and its replacement is not serving yet, so two
	// never restart at once. Needs max_lifetime. Default: on for
	// lifetime_first, off otherwise.
	StaggerDrains *bool `json:"stagger_drains,omitempty"`
	// MaxSession is the longest a session may live; its agent then closes
	// it with a close frame that says so. 0: no limit. Default: 0.
	MaxSession caddy.Duration `json:"max_session,omitempty"`
	// IdleTimeout ends a session that carried no data frame either way
	// for this long (pings do not count). 0: off. Default: 0.
	IdleTimeout caddy.Duration `json:"idle_timeout,omitempty"`
	// MaxScan bounds the unusable workers (stale, suspect, held back) one
	// decision walks past, 1-256. Default: 16.
	MaxScan int `json:"max_scan,omitempty"`
	// SelectTimeout is how long a request waits for a free worker, then
	// 503 with Retry-After. Default: 5s.
	SelectTimeout caddy.Duration `json:"select_timeout,omitempty"`
	// QueueSize is how many requests may wait for a pool, across every
	// instance sharing the Redis; the next gets 429 with Retry-After.
	// Default: 100.
	QueueSize int `json:"queue_size,omitempty"`
	// ClientLimit is the most live sessions one client (ClientKey) may
	// hold in a pool, across every instance; the next gets 429. 0: no
	// limit. Default: 0.
	ClientLimit int `json:"client_limit,omitempty"`
	// ClientKey names the client, a placeholder expanded per request; only
	// its SHA-256 reaches Redis. Default: {http.vars.client_ip} (an IPv6
	// client's /64).
	ClientKey string `json:"client_key,omitempty"`
	// VersionRouting sends a Playwright client only to workers of its
	// major.minor, and answers 428 for a version no worker serves.
	// Default: on.
	VersionRouting *bool `json:"version_routing,omitempty"`
	// SharedQueue orders the requests waiting for a pool across every
	// instance sharing the Redis, and bounds them there by QueueSize; off,
	// each instance queues its own, which saves the queue's Redis calls
	// but lets a busy instance's waiters lose slots to a quiet one's.
	// Default: on.
	SharedQueue *bool `json:"shared_queue,omitempty"`
}

// PolicyOptions are the policies' own options; each policy takes only
// its own.
type PolicyOptions struct {
	// Samples is vnode's K, 1-8. Default: 2.
	Samples int `json:"samples,omitempty"`
	// SlotJitter is vnode's random 0..n-1 added to each candidate's live
	// sessions, 0-64. Default: 4.
	SlotJitter *int `json:"slot_jitter,omitempty"`
	// Window is fair share's count of recent durations, 1-100. Default: 20.
	Window int `json:"window,omitempty"`
	// Median makes fair share use the moving median. Default: false (the
	// moving average).
	Median bool `json:"median,omitempty"`
	// DefaultEstimate is fair share's estimate of a worker with no
	// history, whole milliseconds. Default: 30s.
	DefaultEstimate caddy.Duration `json:"default_estimate,omitempty"`
}

// set reports which PolicyOptions are set.
func (o PolicyOptions) set() []string {
	var out []string
	if o.Samples != 0 {
		out = append(out, "samples")
	}
	if o.SlotJitter != nil {
		out = append(out, "slot_jitter")
	}
	if o.Window != 0 {
		out = append(out, "window")
	}
	if o.Median {
		out = append(out, "median")
	}
	if o.DefaultEstimate != 0 {
		out = append(out, "default_estimate")
	}
	return out
}

// Policy is a grid selection policy: it claims a worker in Select, in one
// atomic Redis call, for reverse_proxy to dial. It needs the browser_grid
// upstream source and transport (the browser_grid directive sets them
// up).
type Policy[K policyKind] struct {
	ClaimOptions
	PolicyOptions

	claimer *claimer
}

func (p *Policy[K]) claimerOf() *claimer { return p.claimer }

// kind is the policy's kind.
func (*Policy[K]) kind() policyKind {
	var k K
	return k
}

// CaddyModule returns the Caddy module information.
func (Policy[K]) CaddyModule() caddy.ModuleInfo {
	var k K
	return caddy.ModuleInfo{
		ID:  caddy.ModuleID("http.reverse_proxy.selection_policies." + string(k.name())),
		New: func() caddy.Module { return new(Policy[K]) },
	}
}

// Provision fills the defaults and finds the grid app.
func (p *Policy[K]) Provision(ctx caddy.Context) error {
	var k K
	o := &p.ClaimOptions
	if o.SelectTimeout == 0 {
		o.SelectTimeout = caddy.Duration(DefaultSelectTimeout)
	}
	if o.QueueSize == 0 {
		o.QueueSize = DefaultQueueSize
	}
	if o.MaxScan == 0 {
		o.MaxScan = DefaultMaxScan
	}
	if o.ClientLimit > 0 && o.ClientKey == "" {
		o.ClientKey = DefaultClientKey
	}
	app, err := gridApp(ctx)
	if err != nil {
		return err
	}
	stagger := k.staggers()
	if o.StaggerDrains != nil {
		stagger = *o.StaggerDrains
	}
	p.claimer = &claimer{
		app: app, policy: k.name(), options: k.options(p.PolicyOptions), claim: *o, logger: ctx.Logger(),
		limits: Limits{
			Limits:     registry.Limits{MaxConcurrent: o.MaxConcurrent, MaxLifetime: o.MaxLifetime, StaggerDrains: stagger && o.MaxLifetime > 0},
			MaxSession: time.Duration(o.MaxSession), IdleTimeout: time.Duration(o.IdleTimeout),
		},
	}
	return nil
}

// Validate checks the options, naming the one that is wrong.
func (p *Policy[K]) Validate() error {
	var k K
	name := k.name()
	o := p.ClaimOptions
	switch {
	case o.MaxConcurrent < 0:
		return fmt.Errorf("%s: max_concurrent %d: must be 0 (no cap) or more", name, o.MaxConcurrent)
	case o.MaxLifetime < 0:
		return fmt.Errorf("%s: max_lifetime %d: must be 0 (no limit) or more", name, o.MaxLifetime)
	case o.MaxSession < 0 || o.IdleTimeout < 0 || o.SelectTimeout < 0:
		return fmt.Errorf("%s: max_session, idle_timeout and select_timeout must be more than 0", name)
	case o.MaxScan < 0 || o.MaxScan > selection.MaxVnodeMaxScan:
		return fmt.Errorf("%s: max_scan %d: must be 1-%d", name, o.MaxScan, selection.MaxVnodeMaxScan)
	case o.QueueSize < 0 || o.ClientLimit < 0:
		return fmt.Errorf("%s: queue_size and client_limit must be 1 or more", name)
	case o.ClientKey != "" && o.ClientLimit == 0:
		return fmt.Errorf("%s: client_key %q needs client_limit", name, o.ClientKey)
	}
	if o.ClientKey != "" {
		if err := checkClientKeyPlaceholder(o.ClientKey); err != nil {
			return fmt.Errorf("%s: client_key %q: %w", name, o.ClientKey, err)
		}
	}
	own := k.own()
	for _, opt := range p.PolicyOptions.set() {
		if !slices.Contains(own, opt) {
			return fmt.Errorf("%s: %s is an option of another policy", name, opt)
		}
	}
	po := p.PolicyOptions
	switch {
	case po.Samples < 0 || po.Samples > selection.MaxSamples:
		return fmt.Errorf("%s: samples %d: must be 1-%d", name, po.Samples, selection.MaxSamples)
	case po.SlotJitter != nil && (*po.SlotJitter < 0 || *po.SlotJitter > selection.MaxSlotJitter):
		return fmt.Errorf("%s: slot_jitter %d: must be 0-%d", name, *po.SlotJitter, selection.MaxSlotJitter)
	case po.Window < 0 || po.Window > 100:
		return fmt.Errorf("%s: window %d: must be 1-100", name, po.Window)
	case po.DefaultEstimate < 0 || time.Duration(po.DefaultEstimate)%time.Millisecond != 0:
		return fmt.Errorf("%s: default_estimate %s: must be whole milliseconds, more than 0", name, time.Duration(po.DefaultEstimate))
	}
	return nil
}

// Select claims a worker for the request and returns the upstream that
// dials it (the browser_grid source's, its address set to the worker's);
// nil when there is none, with the reason in the request's attempt.
func (p *Policy[K]) Select(pool reverseproxy.UpstreamPool, r *http.Request, _ http.ResponseWriter) *reverseproxy.Upstream {
	a := attemptOf(r)
	if a == nil || len(pool) == 0 {
		if a != nil {
			a.fail(outcomeMisconfigured, "the grid is misconfigured: its policy needs the browser_grid upstream source")
		}
		return nil
	}
	if p.claimer.next(r, a) == nil {
		return nil
	}
	return pool[0]
}

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens. Syntax:
//
//	lb_policy <lifetime_first|vnode|fair_share|interleaved_weighted_round_robin> {
//	    max_concurrent   <n>
//	    max_lifetime     <n>
//	    stagger_drains   [on|off]
//	    max_session      <duration>
//	    idle_timeout     <duration>
//	    max_scan         <1-256>
//	    select_timeout   <duration>
//	    queue_size       <n>
//	    client_limit     <n>
//	    client_key       <placeholder>
//	    version_routing  [on|off]
//	    shared_queue     [on|off]
//	    samples          <1-8>         # vnode
//	    slot_jitter      <0-64>        # vnode
//	    window           <1-100>       # fair_share
//	    median                         # fair_share
//	    default_estimate <duration>    # fair_share
//	}
func (p *Policy[K]) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	var k K
	d.Next() // consume policy name
	if d.NextArg() {
		return d.ArgErr()
	}
	var opts policyBlock
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if ok, err := opts.parse(d); err != nil {
			return err
		} else if !ok {
			return d.Errf("unrecognized %s option '%s'", k.name(), d.Val())
		}
	}
	if err := opts.check(k); err != nil {
		return err
	}
	p.ClaimOptions, p.PolicyOptions = opts.ClaimOptions, opts.PolicyOptions
	return nil
}

// policyBlock is a policy's options as a Caddyfile gives them, in the
// lb_policy block or the browser_grid directive, with where each of the
// policies' own options and client_key stand.
type policyBlock struct {
	ClaimOptions
	PolicyOptions
	seen  map[string]bool
	lines map[string]string // option -> "file:line"
}

// parse parses the option at the dispenser's cursor; false: it is none of
// the policies' options.
func (b *policyBlock) parse(d *caddyfile.Dispenser) (bool, error) {
	if b.seen == nil {
		b.seen, b.lines = map[string]bool{}, map[string]string{}
	}
	name := d.Val()
	o, po := &b.ClaimOptions, &b.PolicyOptions
	ranges := map[string][2]int{
		"max_concurrent": {0, 1 << 20}, "max_lifetime": {0, 1 << 30}, "max_scan": {1, selection.MaxVnodeMaxScan},
		"queue_size": {1, 1 << 20}, "client_limit": {1, 1 << 20},
		"samples": {1, selection.MaxSamples}, "slot_jitter": {0, selection.MaxSlotJitter}, "window": {1, 100},
	}
	switch name {
	case "stagger_drains", "version_routing", "shared_queue", "median", "client_key", "max_session", "idle_timeout", "select_timeout", "default_estimate":
	default:
		if _, ok := ranges[name]; !ok {
			return false, nil
		}
	}
	if b.seen[name] {
		return true, d.Errf("%s already specified", name)
	}
	b.seen[name] = true
	b.lines[name] = fmt.Sprintf("%s:%d", d.File(), d.Line())
	switch name {
	case "stagger_drains", "version_routing", "shared_queue":
		on := true
		if d.NextArg() {
			switch d.Val() {
			case "on":
			case "off":
				on = false
			default:
				return true, d.Errf("invalid %s '%s': use on or off", name, d.Val())
			}
		}
		if d.NextArg() {
			return true, d.ArgErr()
		}
		switch name {
		case "stagger_drains":
			o.StaggerDrains = &on
		case "version_routing":
			o.VersionRouting = &on
		default:
			o.SharedQueue = &on
		}
	case "median":
		if d.NextArg() {
			return true, d.ArgErr()
		}
		po.Median = true
	case "client_key":
		v, err := oneArg(d)
		if err != nil {
			return true, err
		}
		if err := checkClientKeyPlaceholder(v); err != nil {
			return true, d.Errf("invalid client_key '%s': %v", v, err)
		}
		o.ClientKey = v
	case "max_session", "idle_timeout", "select_timeout", "default_estimate":
		dur, err := durationArg(d, name)
		if err != nil {
			return true, err
		}
		switch name {
		case "max_session":
			o.MaxSession = caddy.Duration(dur)
		case "idle_timeout":
			o.IdleTimeout = caddy.Duration(dur)
		case "select_timeout":
			o.SelectTimeout = caddy.Duration(dur)
		default:
			if dur%time.Millisecond != 0 {
				return true, d.Errf("invalid default_estimate '%s': must be whole milliseconds", dur)
			}
			po.DefaultEstimate = caddy.Duration(dur)
		}
	default:
		r := ranges[name]
		n, err := intArg(d, name, r[0], r[1])
		if err != nil {
			return true, err
		}
		switch name {
		case "max_concurrent":
			o.MaxConcurrent = n
		case "max_lifetime":
			o.MaxLifetime = n
		case "max_scan":
			o.MaxScan = n
		case "queue_size":
			o.QueueSize = n
		case "client_limit":
			o.ClientLimit = n
		case "samples":
			po.Samples = n
		case "slot_jitter":
			po.SlotJitter = &n
		case "window":
			po.Window = n
		}
	}
	return true, nil
}

// check refuses, naming its line, an option of another policy than k's
// and a client_key without client_limit.
func (b *policyBlock) check(k policyKind) error {
	for _, opt := range b.PolicyOptions.set() {
		if !slices.Contains(k.own(), opt) {
			return fmt.Errorf("%s - Error during parsing: %s is an option of another policy than %s", b.lines[opt], opt, k.name())
		}
	}
	if b.ClientKey != "" && b.ClientLimit == 0 {
		return fmt.Errorf("%s - Error during parsing: client_key needs client_limit <n>", b.lines["client_key"])
	}
	return nil
}

// routing resolves VersionRouting with its default (on).
func (o ClaimOptions) routing() bool { return o.VersionRouting == nil || *o.VersionRouting }

// shared resolves SharedQueue with its default (on).
func (o ClaimOptions) shared() bool { return o.SharedQueue == nil || *o.SharedQueue }

// checkClientKeyPlaceholder refuses a client_key without a placeholder:
// every client would share one budget.
func checkClientKeyPlaceholder(key string) error {
	open := strings.Index(key, "{")
	if open < 0 || !strings.Contains(key[open:], "}") {
		return errors.New("no placeholder: every client would share one budget; name the client with a placeholder, e.g. {http.auth.user.id} or {http.request.header.X-User}")
	}
	return nil
}

func oneArg(d *caddyfile.Dispenser) (string, error) {
	if !d.NextArg() {
		return "", d.ArgErr()
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.ArgErr()
	}
	return v, nil
}

// durationArg parses an option's one duration, more than 0.
func durationArg(d *caddyfile.Dispenser, name string) (time.Duration, error) {
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, d.Errf("invalid %s '%s': %v", name, v, err)
	}
	if dur <= 0 {
		return 0, d.Errf("invalid %s '%s': must be more than 0", name, v)
	}
	return dur, nil
}

// intArg parses an option's one integer within [lo, hi].
func intArg(d *caddyfile.Dispenser, name string, lo, hi int) (int, error) {
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, d.Errf("invalid %s '%s': not a whole number", name, v)
	}
	if n < lo || n > hi {
		return 0, d.Errf("invalid %s '%s': must be %d-%d", name, v, lo, hi)
	}
	return n, nil
}

// Interface guards.
var (
	_ caddy.Provisioner     = (*Policy[lifetimeFirst])(nil)
	_ caddy.Validator       = (*Policy[lifetimeFirst])(nil)
	_ reverseproxy.Selector = (*Policy[lifetimeFirst])(nil)
	_ caddyfile.Unmarshaler = (*Policy[lifetimeFirst])(nil)
)
