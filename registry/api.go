// Package registry is the one place that knows Redis: the key schema, the
// worker records, and the Lua scripts that register, heartbeat, select and
// claim, release, undo and expire.
//
// The exported names and signatures below are the contract the worker
// agent, the reaper and the Caddy modules build against; signatures change
// only together with their callers. The methods delegate to the files
// beside this one; the key schema is in keys.go and the Lua scripts in lua/.
package registry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/redis/go-redis/v9"
)

// MaxVirtualNodes is the most ring positions a worker may register
// (Registration.VirtualNodes).
const MaxVirtualNodes = 64

// Sentinel errors. Callers test them with errors.Is.
var (
	// ErrNoWorker: no eligible worker in the pool right now.
	ErrNoWorker = errors.New("no eligible worker")
	// ErrNotRegistered: the worker's record is gone (expired or reaped);
	// its agent should register again.
	ErrNotRegistered = errors.New("worker not registered")
	// ErrBadPool: a pool name that cannot be used in a key.
	ErrBadPool = errors.New("invalid pool name")
	// ErrClaimCancelled: the claim's lease ID was cancelled (or its lease
	// already ended) before the claim ran; nothing was claimed.
	ErrClaimCancelled = errors.New("claim cancelled")
)

// Policy names a select-and-claim algorithm.
type Policy string

// The policies the registry runs in Redis.
const (
	LifetimeFirst Policy = "lifetime_first"
	Vnode         Policy = "vnode"
	FairShare     Policy = "fair_share"
	// InterleavedWeightedRoundRobin deals turns in rounds by the workers'
	// registered weights (Registration.Weight; selection's
	// InterleavedWeightedRoundRobin), its cursor kept in the pool.
	InterleavedWeightedRoundRobin Policy = "interleaved_weighted_round_robin"
)

// Command is an instruction for a worker's agent, read with its heartbeat.
type Command string

// CommandShutdown tells the agent to drain and exit.
const CommandShutdown Command = "shutdown"

// Options configure a Registry.
type Options struct {
	// Prefix of every key. Default: "grid" (keys look like "{grid:chromium}:…").
	Prefix string
	// CommandTTL is how long a shutdown command lives. Default: 60s.
	CommandTTL time.Duration
	// DurationWindow is how many session durations are kept per worker for
	// fair share. Default: 20.
	DurationWindow int
	// OnBadRecord, when set, is told about every worker record that does not
	// parse; the record is skipped, never selected.
	OnBadRecord func(pool, workerID string, err error)
	// NoStaleExpiry stops claims from handing the stale workers they walk
	// past to a background Expire with skip_if_fresh (the vnode design's expire
	// scheduler); the reaper then removes them. Default: false (expire).
	NoStaleExpiry bool
	// OnStale, when set, is told the pool of every claim (not a Pick)
	// that walked past stale workers, whether or not NoStaleExpiry is
	// set: its owner may wake its reaper (reaper.Reaper.Kick), since the
	// claims' own expiry is bounded and drops what it cannot take. It is
	// called on the claim's path, so it must return at once. Default:
	// nil (nobody is told).
	OnStale func(pool string)
	// LeaseSweep is how many expired leases a heartbeat, and one claim in
	// 8 (and a claim that would otherwise be refused), frees before it
	// does its own work, so that active counts heal without a reaper.
	// Default: 64.
	LeaseSweep int
	// TombstoneTTL is how long the ID of a released, undone or cancelled
	// lease is remembered: a claim with that ID arriving meanwhile (run
	// late, after its caller gave up and cancelled it) claims nothing, and
	// a renewal does not bring the lease back. It must outlast the longest
	// time a claim may wait in a connection or a stalled Redis. Default: 10m.
	TombstoneTTL time.Duration
	// MaxBatch is how many claims (or lease ends) of one pool one call to
	// Redis carries at most. A claim or release that arrives while one of
	// the same pool is in flight from this process waits for it and goes
	// in the next call with the others that waited, so a busy pool pays
	// Redis' per-call cost (a round trip, the function's setup) once per
	// batch instead of once per session; a lone call goes at once, as
	// before. 1 sends every call alone; values above MaxBatchCap (256)
	// are taken as 256. Default: 32 (DefaultMaxBatch).
	MaxBatch int
	// OnBatch, when set, is told how many claims (script "claim") or
	// lease ends ("lease": release, undo, cancel) of pool each call to
	// Redis carried: 1 for a call that went alone. It is called on the
	// calls' path, so it must return at once. Default: nil.
	OnBatch func(pool, script string, calls int)
}

// Registry talks to one Redis (single node, Sentinel or Cluster).
type Registry struct {
	rdb  redis.UniversalClient
	opts Options
	// expiring holds "pool\x00id" of workers being expired in the
	// background (single flight per process); expireSlots bounds how many.
	expiring    sync.Map
	expireSlots chan struct{}
	// sweep chooses the claims that free expired leases first (sweep.go).
	sweep claimSweeper
	// batch groups a pool's concurrent claims and lease ends (batch.go);
	// maxBatch is Options.MaxBatch as taken (maxBatchOf), changed by
	// SetMaxBatch (r.opts.MaxBatch is what the caller gave).
	batch    batcher
	maxBatch atomic.Int64
}

// New returns a Registry over rdb.
func New(rdb redis.UniversalClient, opts Options) *Registry { return newRegistry(rdb, opts) }

// NewClient connects to the Redis named by a URL: redis://, rediss:// (TLS),
// with user:password and /db; redis+cluster:// / rediss+cluster:// with
// several host:port separated by commas for Redis Cluster; or
// redis+sentinel://[user:password@]master-name@h1:p1,h2:p2[/db] for a
// master watched by Redis Sentinel (the sentinels' own password is the
// option sentinel_password). Every client honours its caller's context
// deadline, has the Default* timeouts unless the URL sets its own, and
// never resends a script that may have run (see retryGuard in client.go).
func NewClient(url string) (redis.UniversalClient, error) { return newClient(url) }

// RedactURL returns url with any password replaced, fit for logs.
func RedactURL(url string) string { return redactURL(url) }

// Registration is what a worker's agent writes when it starts.
type Registration struct {
	// Pool is the pool the worker serves; a Playwright worker registers in
	// its version's group of it, GroupPool(pool, "1.65"), and keeps that
	// name for its heartbeats and deregistration.
	Pool        string
	ID          string
	BrowserType string
	// Addr is the host:port a proxy dials (valid UTF-8, as are
	// BrowserType, Path and Generation: a proxy could not read other bytes
	// back as given).
	Addr string
	// Path is the WebSocket path on the worker, e.g. "/playwright".
	Path string
	// Capacity is how many sessions the worker accepts at once (0: no limit).
	Capacity int
	// Weight is the worker's share of turns under interleaved weighted
	// round robin, 0-selection.MaxWeight. Default: 0 (its Capacity, or 1
	// when that is 0).
	Weight int
	// TTL of the worker's record; every heartbeat renews it. Default: 30s.
	TTL time.Duration
	// VirtualNodes is V, the worker's ring positions. Default: 8.
	VirtualNodes int
	// Generation names the browser process this registration is for
	// (letters, digits and punctuation, no spaces, at most 200 bytes). An
	// agent picks one per browser process and passes the same one when it
	// registers again after its record was lost (ErrNotRegistered): the
	// worker then keeps its live sessions' count (its leases), its lifetime
	// and a pending shutdown command. A different generation starts from
	// zero. Default: "" (a random one: a new start).
	Generation string
	// Lifetime is the lifetime count the agent last saw (HeartbeatReply),
	// re-asserted when it registers again: the registered lifetime is at
	// least this. Default: 0.
	Lifetime int
	// Secret, when set, signs the record: it carries an HMAC-SHA256 over
	// Pool, ID, Addr, Path and this registration's generation, which a
	// proxy holding the same secret verifies (WorkerInfo.CheckSignature)
	// before it dials. The secret is not stored. Default: none (unsigned).
	Secret []byte
	// Draining registers the worker as draining (never selected), for an
	// agent whose record was lost while it drains. Default: false.
	Draining bool
	// Hold, for an agent registering again because its record was lost,
	// keeps the worker out of selection (suspect) for this long when the
	// pool's data was lost too: no dataset epoch, or one made less than
	// Hold ago by the first claim after the loss (or MarkEpoch). The
	// claimers that served
	// it re-assert the sessions Redis lost meanwhile (AssertLifetimes,
	// RenewLeases), and a lifetime they raise is the whole count only
	// while no new session was counted on it (the raise takes the higher
	// of the two, it does not add). A record that merely lapsed kept its
	// count, and is not held, but in a pool with no epoch at all, where a
	// lapse cannot be told from a loss. ReassertHold is the agent's.
	// Default: none.
	Hold time.Duration
	// Exclusive says this browser is the only one at its address and path
	// (grid-worker's registrations are): an available record of another
	// ID registered as exclusive at the same address and path before is
	// removed, as a deregistration would (its leases stay). That one is a
	// browser that crashed with its agent, never deregistered, whose port
	// a restarted worker now listens on: claims through it reached the new
	// browser beside its own record's, past its cap and max_lifetime,
	// until it went stale. A draining record stays (it takes no session).
	// Records of several workers at one address (tests, benchmarks, one
	// server counted as many) register without it. Default: false.
	Exclusive bool
}

// weight is the registered weight with its default.
func (reg Registration) weight() int {
	if reg.Weight > 0 {
		return reg.Weight
	}
	return min(max(reg.Capacity, 1), selection.MaxWeight)
}

// HeartbeatReply is what a heartbeat returns.
type HeartbeatReply struct {
	// Command is the pending command ("" when none).
	Command Command
	// Lifetime and Active are the worker's counts as Redis holds them: the
	// agent keeps Lifetime to re-assert it (Registration.Lifetime) if the
	// record is lost.
	Lifetime, Active int
}

// WorkerInfo is a worker's record as stored, with its counters.
type WorkerInfo struct {
	// Pool is the name the worker registered under: a pool, or a version
	// group of it ("chromium@1.65", see GroupPool).
	Pool, ID, BrowserType string
	// PlaywrightVersion is the major.minor of the Playwright browser
	// server the worker runs, from its group ("" for none: CDP, exec).
	PlaywrightVersion string
	Addr, Path        string
	Status            selection.Status
	Active, Lifetime  int
	Capacity          int
	VirtualNodes      int
	LastHeartbeat     time.Time
	RegisteredAt      time.Time
	SuspectUntil      time.Time
	PredictedEnd      time.Time
	Durations         []time.Duration
	// Command is the pending command, if any.
	Command Command
	// ExpiresAt is when the record lapses unless a heartbeat renews it
	// (registration or last heartbeat + TTL).
	ExpiresAt time.Time
	// gen identifies the registration; leases of an older one move no
	// counters.
	gen string
	// sig is the record's signature (hex), "" when unsigned.
	sig string
}

// Snapshot converts the record to what the selection package works on.
func (w WorkerInfo) Snapshot() selection.Worker { return w.snapshot() }

// BadRecord is a worker record that could not be parsed.
type BadRecord struct {
	ID  string
	Err string
}

// PoolInfo is everything Inspect knows about one pool.
type PoolInfo struct {
	Pool string
	// Now is Redis' time when the pool was read (the clock records'
	// heartbeats and expiries are written in).
	Now        time.Time
	Workers    []WorkerInfo
	BadRecords []BadRecord
	// Leases is the pool's live leases (lease_owner's entries; ended
	// leases' tombstones do not count).
	Leases int
	// Limits last written by a claim for this pool (Retiring is false:
	// see Retiring below).
	Limits selection.Limits
	// Retiring lists the members of the pool's retiring set, sorted: the
	// workers draining, at the lifetime limit or told to shut down. A
	// member whose heartbeat is stale is dead and holds nothing back.
	Retiring []string
	// Indexes are the optional indexes the pool keeps (docs/redis.md,
	// "Kept indexes"), for the pool and, from InspectGroups, each of its
	// version groups; idx:lifetime, kept for every pool, is not listed.
	Indexes []IndexState
}

// IndexState is one optional index a pool (or version group) keeps.
type IndexState struct {
	// Pool is the pool or version group (GroupPool) the index is of.
	Pool string
	// Name is the index as the config hash names it: "ring", "fair" or
	// "iwrr"; Policy is the policy that walks it.
	Name   string
	Policy Policy
	// State is "complete", "building" (its policy's claims choose as
	// lifetime_first until it is complete), or "kept" (no claim of this
	// version has settled the pool yet: every index is kept, as older
	// versions did).
	State string
	// LastWalked is when a claim last walked it, noted at most every 15
	// minutes (zero for "kept"); an index not walked for an hour is dropped.
	LastWalked time.Time
}

// Register writes (or rewrites) a worker's record, status available, its
// ring positions, and adds the pool to the pool list. Counters start at
// zero for a new generation; the same generation (or no stored record)
// carries on with its live leases and lifetime (see
// Registration.Generation).
func (r *Registry) Register(ctx context.Context, reg Registration) error { return r.register(ctx, reg) }

// Heartbeat renews the record and its TTL, and returns the pending command
// and the worker's counts in the same round trip. ErrNotRegistered when
// the record is gone.
func (r *Registry) Heartbeat(ctx context.Context, pool, id string, ttl time.Duration) (HeartbeatReply, error) {
	return r.heartbeat(ctx, pool, id, ttl)
}

// SetDraining marks a worker draining: selection skips it from now on.
func (r *Registry) SetDraining(ctx context.Context, pool, id string) error {
	return r.update(ctx, pool, id, "draining", string(CommandShutdown), r.opts.CommandTTL)
}

// Deregister removes a worker's record and everything registration wrote
// (its leases stay until released or lapsed).
func (r *Registry) Deregister(ctx context.Context, pool, id string) error {
	_, err := r.expire(ctx, pool, id, 0)
	return err
}

// Worker returns one worker's record. ErrNotRegistered when it is gone.
func (r *Registry) Worker(ctx context.Context, pool, id string) (WorkerInfo, error) {
	return r.worker(ctx, pool, id)
}

// Drain sets a worker's shutdown command (as an operator or the admin API)
// and takes it out of selection at once: while the command is live it
// takes no new session, before its agent hears the command too.
func (r *Registry) Drain(ctx context.Context, pool, id string) error {
	return r.update(ctx, pool, id, "command", string(CommandShutdown), r.opts.CommandTTL)
}

// Suspect marks a worker suspect for d, as Undo does with a lease: claims
// walk past it until then. Only registration gen is blamed: a worker that
// registered again since (its browser restarted) is left alone, and that
// is no error. For a worker whose claim was already given back when the
// proof of its fault came (another worker accepted what it refused).
func (r *Registry) Suspect(ctx context.Context, pool, id, gen string, d time.Duration) error {
	return r.update(ctx, pool, id, "suspect", gen, d)
}

// ClaimRequest asks for one session slot in a pool.
type ClaimRequest struct {
	Pool   string
	Policy Policy
	// Limits apply to every policy; they are also written to the pool so
	// that release and heartbeat scripts keep the indexes consistent. When
	// claims bring different MaxConcurrent, MaxLifetime or StaggerDrains,
	// the newest configuration's win (ConfigTime); a change costs O(1) in
	// the claim, and the indexes converge worker by worker (each claim,
	// release and heartbeat reindexes its worker). A worker at or past a
	// lowered MaxLifetime is told to drain by its next heartbeat (one at a
	// time under StaggerDrains). MaxScan 0 means DefaultMaxScan for
	// lifetime_first and fair_share. With StaggerDrains (and MaxLifetime > 0) a worker's last session is
	// not granted while another fresh worker of the pool is retiring, as
	// selection.Limits.HeldBack says; whether one is comes from the pool's
	// retiring set in Redis, so Limits.Retiring is ignored. Beyond
	// selection's IsRetiring, a worker with a live shutdown command (an
	// operator's Drain) counts as retiring: its agent drains at its next
	// heartbeat.
	Limits selection.Limits
	// DrainHold bounds, under StaggerDrains, how long a worker retiring
	// with sessions left (draining them, or at its limit or told to shut
	// down before its agent heard) holds the other workers' last sessions
	// back: from when a claim first saw it so, for DrainHold,
	// then no longer (the next worker may take its last session and
	// retire; its restart still waits its turn, heartbeat.lua). A worker
	// held back takes no session either way, so a hold as long as a long
	// session stops the pool once every other worker has reached its
	// last session. 0 holds them back for as long as it drains, as
	// selection.Limits.HeldBack says; Caddy passes half its
	// select_timeout.
	DrainHold time.Duration
	// Vnode and FairShare carry the policy's parameters when it is chosen;
	// zero fields take selection's defaults (SetDefaults). The Limits
	// embedded in them are ignored, except that a vnode claim whose
	// Limits.MaxScan is 0 uses Vnode.MaxScan (default 16), the vnode design's knob.
	Vnode     selection.Vnode
	FairShare selection.FairShare
	// Rand supplies the random inputs (vnode pivots, jitter, tiebreak).
	// nil: a source seeded from crypto/rand.
	Rand selection.Rand
	// Holder names the claiming process (for operators reading leases).
	Holder string
	// LeaseTTL is how long the lease lives unless renewed. Default: 30s.
	LeaseTTL time.Duration
	// LeaseID keys the claim (no spaces, at most 200 bytes; NewLeaseID
	// makes one): a claim run again with the same ID (a client retry, a
	// caller that lost the reply) returns the claim it made rather than
	// claiming twice, and a claim whose ID was cancelled (Cancel) claims
	// nothing (ErrClaimCancelled). A caller that may have to cancel a claim
	// whose outcome it does not know chooses the ID. Default: "" (a new
	// one, chosen before the script runs so a retry resends it).
	LeaseID string
	// Now, when not zero, replaces Redis' clock (tests only).
	Now time.Time
	// ConfigTime is when the caller's limits were configured (Caddy: when
	// its grid configuration with these limits was first loaded). It
	// decides which limits a pool runs under when claimers disagree: the
	// newest configuration wins. The pool stores the limits in force
	// (MaxConcurrent, MaxLifetime, StaggerDrains and, for fair_share
	// claims, the fair-share Window, Median and Default) with their
	// configuration's time. A claim whose limits differ stores them when
	// its ConfigTime is not older than the stored time; otherwise it runs
	// under the stored limits and reports them in Claim.PoolLimits (or
	// NoWorkerError.PoolLimits) with LimitsOverridden set. Zero means
	// now: the claim's limits win whenever they differ. Clocks of the
	// claimers should agree to within the time between two reloads.
	ConfigTime time.Time
	// Supersedes, when not zero, is a configuration time whose stored
	// limits this claim's replace whatever ConfigTime: that of a newer
	// configuration which stored limits and then went away (Caddy: a
	// reload that failed after its config served claims). Once replaced,
	// the claim's limits carry ConfigTime, so any configuration newer
	// than it wins again, as it did before. Limits stored with any other
	// time are compared by ConfigTime as usual. Compared in milliseconds.
	Supersedes time.Time
	// Epoch is the pool's dataset epoch this caller last saw (Claim.Epoch,
	// NoWorkerError.Epoch); "" for none. When Redis no longer has it (it
	// restarted empty, or failed over to a replica without it), the claim
	// grants nothing and returns an *EpochError: the caller's live leases
	// may be gone with it, so it re-asserts them (RenewLeases) first.
	Epoch string
	// ClientKey names the client the session is for (an IP address, a
	// user ID); it reaches Redis only as ClientHash. With ClientLimit > 0,
	// a claim for a client that already holds ClientLimit live sessions
	// in the pool, across every process sharing the Redis, claims nothing
	// and returns a *ClientLimitError. A session counts from its claim
	// until its lease ends by any path (release, undo, cancel, expiry).
	// Default: "" (no client: not counted).
	ClientKey string
	// ClientLimit is the most live sessions ClientKey may hold in the
	// pool. 0: no limit (a session with a ClientKey still counts toward
	// other claims' limits). Default: 0.
	ClientLimit int
	// Avoid lists workers (IDs) the claim walks past as if they were
	// suspect: those that refused this request's earlier attempts in a
	// way that is not yet known to be theirs or the client's (Caddy: a
	// 4xx to the upgrade, held until another worker answers). At most
	// MaxAvoid; an ID no worker has changes nothing. Default: none.
	Avoid []string

	// fallbackScan is lifetime_first's max_scan for this request (set by
	// checkRequest): a claim's budget while its policy's index is being built.
	fallbackScan int
}

// DefaultMaxScan is the max_scan budget of a lifetime_first or fair_share
// claim whose Limits.MaxScan is 0: how many unusable index entries (stale,
// missing, suspect, held back) one claim walks past before it reports no
// worker. Vnode's default is selection.DefaultVnodeMaxScan.
const DefaultMaxScan = 64

// MaxAvoid is the most workers a claim may avoid (ClaimRequest.Avoid).
const MaxAvoid = 16

// PoolLimits are the limits a claim ran under: the request's, or the
// pool's stored ones when a newer configuration brought them.
type PoolLimits struct {
	// MaxConcurrent, MaxLifetime and StaggerDrains in force (the other
	// selection.Limits fields are the request's).
	selection.Limits
	// FairShare's Window, Median and Default in force (fair_share claims).
	Window  int
	Median  bool
	Default time.Duration
}

// Claim is a granted session slot.
type Claim struct {
	LeaseID string
	Pool    string
	// Worker is the chosen worker's record with its counts right after
	// this claim (Worker.Lifetime is what a LeaseRenewal re-asserts).
	Worker WorkerInfo
	// Gen is the generation of the worker's registration the lease belongs
	// to (for LeaseRenewal).
	Gen string
	// Drain is true when this claim brought the worker to its lifetime
	// limit and so set its shutdown command.
	Drain bool
	// Decision carries the scan figures, for metrics.
	Decision selection.Decision
	// PoolLimits are the limits the claim ran under; LimitsOverridden is
	// true when they are not the request's (a newer configuration's limits
	// are stored for the pool: see ClaimRequest.ConfigTime).
	PoolLimits       PoolLimits
	LimitsOverridden bool
	// Epoch is the pool's dataset epoch (see ClaimRequest.Epoch).
	Epoch string
	// Client is ClientHash(ClaimRequest.ClientKey) (for LeaseRenewal).
	Client string
	// IndexBuilding is true when the index the policy walks was still
	// being built (the first claims with a policy on a pool of more than
	// a few hundred workers, or after an hour unused), so this claim
	// chose as lifetime_first does. See docs/redis.md, "Kept indexes".
	IndexBuilding bool
}

// EpochError is returned by Claim when the dataset epoch the caller saw
// is not Redis's: Redis lost data since; nothing was claimed.
type EpochError struct {
	Seen, Now string
}

func (e *EpochError) Error() string {
	return fmt.Sprintf("the pool's data was lost since this claimer last claimed (epoch %q, now %q): re-assert its leases, then claim again", e.Seen, e.Now)
}

// NoWorkerError is returned (wrapping ErrNoWorker) when nothing is
// eligible; it carries the decision's figures.
type NoWorkerError struct {
	Decision selection.Decision
	// Retiring: StaggerDrains was in force and another worker of the pool
	// was retiring, so workers one session short of the lifetime limit
	// were held back (they may have been the only ones left).
	Retiring bool
	// PoolLimits, LimitsOverridden and Epoch: as in Claim.
	PoolLimits       PoolLimits
	LimitsOverridden bool
	Epoch            string
	// IndexBuilding: as in Claim.
	IndexBuilding bool
	// Registered is how many workers the pool has registered (in any
	// state), for a claim that avoided workers (ClaimRequest.Avoid): more
	// than it avoided means others may free up. 0 for other claims.
	Registered int
	// Held is how much longer the pool's claims find no worker because
	// its data came back on another Redis server process (a restart from
	// an older snapshot, a failover): every instance that served the
	// pool re-asserts what it served first (RestoreHold). 0: not held.
	Held time.Duration
}

func (e *NoWorkerError) Error() string { return ErrNoWorker.Error() }
func (e *NoWorkerError) Unwrap() error { return ErrNoWorker }

// Claim selects and claims atomically: active +1, lifetime +1, a lease.
func (r *Registry) Claim(ctx context.Context, req ClaimRequest) (*Claim, error) {
	return r.claim(ctx, req)
}

// StoreLimits stores req's limits for req.Pool as a claim with req would
// (the newest configuration's win: ClaimRequest.ConfigTime, Supersedes),
// and claims nothing: the limits then apply to every claim of the pool,
// whichever configuration it comes from, before req's configuration makes
// one (Caddy stores a configuration's new limits as it starts). It
// returns the limits in force and whether they are not req's. Only the
// fields of req that a claim stores matter (Pool, Policy, Limits,
// FairShare, ConfigTime, Supersedes, Now).
func (r *Registry) StoreLimits(ctx context.Context, req ClaimRequest) (PoolLimits, bool, error) {
	return r.storeLimits(ctx, req)
}

// Pick returns what Claim would choose now, claiming nothing.
func (r *Registry) Pick(ctx context.Context, req ClaimRequest) (WorkerInfo, selection.Decision, error) {
	return r.pick(ctx, req)
}

// Release ends a session: active -1, duration recorded, lease deleted, and
// waiters on the pool woken. Releasing an unknown lease moves nothing.
// Either way the lease ID is tombstoned (Options.TombstoneTTL), so Release
// is safe to retry.
func (r *Registry) Release(ctx context.Context, pool, leaseID string) error {
	return r.endLease(ctx, pool, leaseID, "release", 0)
}

// Cancel makes sure a claim whose outcome the caller does not know (its
// call failed or timed out) leaves nothing: if it ran, it is undone
// (active and lifetime given back, no suspicion); if it has not run yet,
// its lease ID is tombstoned so that it claims nothing when it does
// (ErrClaimCancelled). Safe to retry.
func (r *Registry) Cancel(ctx context.Context, pool, leaseID string) error {
	return r.endLease(ctx, pool, leaseID, "cancel", 0)
}

// Undo gives a claim back whose dial or upgrade failed: active -1 and
// lifetime -1, the lease deleted, a shutdown command set by this claim
// withdrawn, and the worker suspect for suspectFor (0: not suspect). The
// lease ID is tombstoned as by Release.
func (r *Registry) Undo(ctx context.Context, pool, leaseID string, suspectFor time.Duration) error {
	return r.endLease(ctx, pool, leaseID, "undo", suspectFor)
}

// LeaseRenewal is one live lease as its holder knows it, so that a renewal
// can re-assert what Redis lost.
type LeaseRenewal struct {
	// ID is the lease ID (Claim.LeaseID).
	ID string
	// Worker and Gen own the lease (Claim.Worker.ID, Claim.Gen).
	Worker, Gen string
	// Claimed is when the session was claimed (for its duration at release).
	Claimed time.Time
	// Lifetime is the worker's lifetime right after the claim
	// (Claim.Worker.Lifetime).
	Lifetime int
	// Client is the lease's client hash (Claim.Client; "" none): a
	// re-created lease counts for its client again.
	Client string
}

// RenewResult says what a renewal found besides live leases.
type RenewResult struct {
	// Recreated leases were missing from Redis (expired while their holder
	// could not reach it, or lost by a restart or failover) and were
	// written again; their workers' counts were re-asserted.
	Recreated []string
	// Ended leases were released, undone or cancelled: their holder should
	// stop renewing them.
	Ended []string
}

// RenewLeases extends the given leases of one pool to ttl from now in one
// round trip. A lease missing from Redis and not ended is re-created with
// its owner: when the worker's record exists with that generation, its
// active count is recomputed from its leases and its lifetime raised to at
// least the lease's Lifetime.
func (r *Registry) RenewLeases(ctx context.Context, pool string, leases []LeaseRenewal, ttl time.Duration) (RenewResult, error) {
	return r.renewLeases(ctx, pool, leases, ttl)
}

// LifetimeFloor is what a claimer knows of a worker's lifetime: the
// highest Claim.Worker.Lifetime among the sessions it served on that
// worker's registration generation.
type LifetimeFloor struct {
	Worker, Gen string
	Lifetime    int
}

// AssertResult says what AssertLifetimes changed.
type AssertResult struct {
	// Raised: workers registered with the floor's generation whose
	// lifetime was below it.
	Raised int
	// Kept: floors of workers with no record, kept for their comeback
	// (their agent's registration takes the highest of it and its own).
	Kept int
}

// AssertLifetimes re-asserts the sessions a claimer saw served once Redis
// lost the pool's data (an EpochError, or a renewal that re-created
// leases): the leases of live sessions carry their workers' lifetimes back
// (RenewLeases), but sessions that ended since a worker's last heartbeat
// are in no lease, and its agent re-asserts only the lifetime of that
// heartbeat. Each worker registered with the floor's generation gets its
// lifetime raised to at least the floor (and its shutdown command when
// that reaches max_lifetime); one with no record keeps the floor for its
// registration, as a stale expiry keeps a lapsed worker's. Floors of
// another generation than the record's change nothing. Safe to repeat.
func (r *Registry) AssertLifetimes(ctx context.Context, pool string, floors []LifetimeFloor) (AssertResult, error) {
	return r.assertLifetimes(ctx, pool, floors)
}

// Epochs reads the dataset epoch of each pool (a version group reads its
// pool's), "" for a pool that has none (no claim since its data was made,
// or lost), in one round trip per Redis node. It changes nothing: a
// claimer that holds floors or leases polls it to learn of a loss without
// claiming (see AssertLifetimes).
func (r *Registry) Epochs(ctx context.Context, pools []string) (map[string]string, error) {
	return r.epochs(ctx, pools)
}

// MarkEpoch gives the pool a dataset epoch when it has none (its data was
// lost and no claim has made one since), as its first claim would, and
// returns the pool's epoch. A claimer that re-asserts a loss it learned of
// without claiming (Epochs) marks it so: a second loss, before any claim,
// then shows as another change instead of as the same missing epoch.
func (r *Registry) MarkEpoch(ctx context.Context, pool string) (string, error) {
	return r.markEpoch(ctx, pool)
}

// ReassertHold is the Hold of an agent that registers again after its
// record was lost. Caddy reads its pools' epochs every half second while
// it holds what it served there (its epoch watch, RestoreHold/2), so each
// instance re-asserts a loss within about that of Redis coming back,
// whichever instance claims first; the hold gives it four times that (it
// gave twice a watch of a second before).
const ReassertHold = 2 * time.Second

// RestoreHold is how long a pool's claims find no worker after its data
// came back on another Redis server process (a restart from an older
// snapshot, a failover to a replica): the records are there, so no
// registration is held, but the sessions served since the data was
// written are gone from them, and an instance that served some and does
// not claim now learns of it only at its epoch watch. Caddy reads its
// pools' epochs every RestoreHold/2, so the hold gives every instance
// twice that to re-assert what it served (NoWorkerError.Held).
const RestoreHold = time.Second

// NewLeaseID returns a fresh lease ID for ClaimRequest.LeaseID.
func NewLeaseID() string { return newToken(12) }

// NewGeneration returns a fresh Registration.Generation.
func NewGeneration() string { return newToken(8) }

// Wakeups delivers a pool's name whenever a slot may have freed in it
// (release, undo, registration), from any process sharing the Redis. The
// channel closes when ctx ends.
func (r *Registry) Wakeups(ctx context.Context, pools ...string) (<-chan string, error) {
	return r.wakeups(ctx, pools)
}

// Expire removes a worker whose heartbeat is older than staleAfter (seed
// 002's skip_if_fresh), with its ring positions, counters and index
// entries, in one script. staleAfter 0 removes it unconditionally. Its
// leases stay (they count again if the same generation registers again;
// abandoned ones lapse by their TTL), and so does a live shutdown command
// of a worker removed as stale. Reports whether it removed anything.
func (r *Registry) Expire(ctx context.Context, pool, id string, staleAfter time.Duration) (bool, error) {
	return r.expire(ctx, pool, id, staleAfter)
}

// ExpireStale is Expire with skip_if_fresh for many workers of a pool,
// up to 100 per script call: it removes those whose heartbeat is older
// than staleAfter (0: only a lapsed record TTL counts), whose record TTL
// has passed, or whose record does not parse, and returns the ids removed.
func (r *Registry) ExpireStale(ctx context.Context, pool string, ids []string, staleAfter time.Duration) ([]string, error) {
	return r.expireStale(ctx, pool, ids, staleAfter)
}

// ExpireLeases handles up to max due entries of a pool's lease expiry
// set: expired leases are removed and their slots given back, ended
// leases' tombstones past their time forgotten. It returns how many
// leases it removed.
func (r *Registry) ExpireLeases(ctx context.Context, pool string, max int) (int, error) {
	return r.expireLeases(ctx, pool, max)
}

// Reconcile is the reaper's consistency pass over one pool (one script):
// expired leases freed, active counts set to the live leases, indexes fixed,
// orphaned ring and index entries and counters removed.
func (r *Registry) Reconcile(ctx context.Context, pool string) (ReconcileResult, error) {
	return r.reconcile(ctx, pool)
}

// ForgetLimits drops the limits pool stores when they carry exactly the
// configuration time at (compared in ms): those of a configuration that
// went away (Caddy: a reload that failed after its config served claims
// with limits of its own). The pool's next claim then stores its own, as
// on a pool that never had any, so the newest configuration among those
// still claiming wins again, also where no claimer supersedes at
// (ClaimRequest.Supersedes). It reports whether the limits were dropped.
func (r *Registry) ForgetLimits(ctx context.Context, pool string, at time.Time) (bool, error) {
	if err := checkPool(pool); err != nil {
		return false, fmt.Errorf("forgetting limits: %w", err)
	}
	n, err := r.fcall(ctx, scriptForget, false, []string{r.Key(pool, keyConfig)}, toMS(at)).Int()
	if err != nil {
		return false, fmt.Errorf("forgetting the limits of pool %q: %w", pool, err)
	}
	return n == 1, nil
}

// Pools lists the pools that have (or had) workers.
func (r *Registry) Pools(ctx context.Context) ([]string, error) { return r.pools(ctx) }

// Inspect returns every worker of a pool with its figures.
func (r *Registry) Inspect(ctx context.Context, pool string) (PoolInfo, error) {
	return r.inspect(ctx, pool)
}

// Interface guards.
var (
	_ error = (*NoWorkerError)(nil)
	_ error = (*EpochError)(nil)
)
