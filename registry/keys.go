package registry

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The key schema. Every key of one pool shares the hash tag
// "{<prefix>:<pool>}", so each script touches one Redis Cluster slot; the
// pool list is the only key outside a pool. docs/redis.md shows how to
// read them with redis-cli.
const (
	keyWorkers     = "workers"       // HASH id -> record (JSON)
	keyActive      = "active"        // HASH id -> live sessions
	keyLifetime    = "lifetime"      // HASH id -> sessions since registration
	keyDurations   = "durations"     // HASH id -> "ms,ms,..." oldest first
	keyCommands    = "commands"      // HASH id -> "shutdown|<expires ms>"
	keyVnodes      = "vnodes"        // HASH id -> ring positions
	keyLeases      = "leases"        // HASH lease id -> lease (JSON), or its tombstone (tombPrefix + forget at ms)
	keyLeaseExpiry = "lease_expiry"  // ZSET lease id by expiry ms (a tombstone's: forget at)
	keyConfig      = "config"        // HASH the pool's limits
	keyIdxLifetime = "idx:lifetime"  // ZSET lifetime-first index
	keyIdxRing     = "idx:ring"      // ZSET (lex) "<pos hex>:<id>"
	keyIdxIdle     = "idx:fair_idle" // ZSET fair share, idle workers
	keyIdxBusy     = "idx:fair_busy" // ZSET fair share, busy workers
	keyIdxEnd      = "idx:fair_end"  // ZSET fair share, busy workers by predicted end
	keyRetiring    = "retiring"      // SET workers draining, at the limit or told to shut down
	keyWakeup      = "wakeup"        // pub/sub channel
	keyReaperLock  = "reaper_lock"   // STRING held while a reaper works on the pool
	// Lease ownership and tombstones (see lua/common.lua, "Leases").
	keyLeaseOwner = "lease_owner" // ZSET (lex, scores 0) "<worker id> <gen> <lease id>" per lease
	// An older version's tombstones (lease id by forget at, ms): read by
	// nobody now, forgotten by reconcile as they come due (docs/redis.md,
	// upgrading). Tombstones live in leases (tombPrefix).
	keyCancelled = "cancelled"
	// Per-client live sessions (see lua/common.lua, "Clients").
	keyLeaseClient = "lease_client" // ZSET (lex, scores 0) "<client hash> <lease id>" per lease with a client
	// Interleaved weighted round robin (see lua/common.lua, KEYS 19-20):
	// its index, and the workers' weights with its cursor. Per version
	// group, like every index.
	keyIdxIWRR = "idx:iwrr" // ZSET (lex, scores 0) "<weight, 6 digits>:<id>" per indexed worker
	keyIWRR    = "iwrr"     // HASH id -> weight; ' round', ' cur': the cursor
	// The figures claims and releases change, beside the record (see
	// lua/common.lua, "Hot figures").
	keyHot = "hot" // HASH id -> "<predicted end> <suspect until>[ <window> <count> <sum> <durations>]"
	// The lifetime of a worker whose record lapsed, kept for its comeback
	// (see lua/common.lua, lapsed_entry).
	keyLapsed = "lapsed" // HASH id -> "<gen> <lifetime> <forget at ms>"
	// The worker registered last at each address and path (see
	// lua/register.lua): a browser restarted at a fixed port replaces the
	// record of the one that crashed there. Per version group.
	keyAddrs = "addrs" // HASH "<addr> <path>" -> id
)

// tombPrefix starts the value of a lease id in leases once the lease
// ended (released, undone or cancelled): "ended:<forget at, Unix ms>". A
// live lease is a JSON object. Keep in step with lua/common.lua's TOMB.
const tombPrefix = "ended:"

// isTombstone reports whether v, a value of leases, is an ended lease's
// tombstone rather than a lease.
func isTombstone(v string) bool { return strings.HasPrefix(v, tombPrefix) }

// poolWide names the keys a pool's version groups share with the pool
// (Key gives a group the pool's own): its config (limits, epoch) and its
// list of versions, and lease_client, so that client_limit counts a
// client's sessions in every group of the pool. A per-pool key that must
// hold across versions belongs here.
var poolWide = map[string]bool{keyConfig: true, keyVersions: true, keyLeaseClient: true}

// poolKeyNames is the KEYS layout every script expects (lua/common.lua).
var poolKeyNames = []string{
	keyWorkers, keyActive, keyLifetime, keyDurations, keyCommands, keyVnodes,
	keyLeases, keyLeaseExpiry, keyConfig,
	keyIdxLifetime, keyIdxRing, keyIdxIdle, keyIdxBusy, keyIdxEnd,
	keyRetiring,
	keyLeaseOwner, keyCancelled,
	keyLeaseClient,
	keyIdxIWRR, keyIWRR,
	keyHot,
	keyLapsed,
	keyAddrs,
}

// maxNameLen bounds pool names and worker IDs.
const maxNameLen = 200

// checkPool validates a pool name: letters, digits, '.', '_' and '-',
// optionally followed by a version group, "@<major>.<minor>" (GroupPool).
func checkPool(pool string) error {
	base, version, grouped := strings.Cut(pool, groupSep)
	if grouped {
		if err := CheckVersion(version); err != nil {
			return fmt.Errorf("%w: %q: %w", ErrBadPool, pool, err)
		}
		pool = base
	}
	if pool == "" {
		return fmt.Errorf("%w: empty", ErrBadPool)
	}
	if len(pool) > maxNameLen {
		return fmt.Errorf("%w: %d bytes, more than %d", ErrBadPool, len(pool), maxNameLen)
	}
	for _, c := range pool {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w: %q has %q (allowed: letters, digits, '.', '_', '-')", ErrBadPool, pool, c)
		}
	}
	return nil
}

// CheckPool reports why the registry would refuse the pool name pool
// (nil: a name it takes, a version group's included). The set of pools in
// Redis may hold names a Redis writer put there; views skip those.
func CheckPool(pool string) error { return checkPool(pool) }

// CheckWorkerID reports why Register would refuse the worker ID id (nil:
// it would take it), for an agent to check the IDs it will make before it
// starts a browser.
func CheckWorkerID(id string) error { return checkID(id) }

// checkID validates a worker ID: printable, no spaces, at most maxNameLen bytes.
func checkID(id string) error {
	if id == "" {
		return fmt.Errorf("invalid worker id: empty")
	}
	if len(id) > maxNameLen {
		return fmt.Errorf("invalid worker id: %d bytes, more than %d", len(id), maxNameLen)
	}
	// cjson stores the bytes, encoding/json reads U+FFFD for a bad one:
	// a proxy would read back another id than the hash field's.
	if !utf8.ValidString(id) {
		return fmt.Errorf("invalid worker id %q: not valid UTF-8", id)
	}
	if i := strings.IndexFunc(id, func(c rune) bool { return !unicode.IsPrint(c) || unicode.IsSpace(c) }); i >= 0 {
		return fmt.Errorf("invalid worker id %q: character %q at %d (no spaces or control characters)", id, id[i], i)
	}
	return nil
}

// checkToken validates a lease ID or a generation: the same rules as a
// worker ID (they are joined with spaces in lease_owner's members).
func checkToken(s string) error {
	if s == "" {
		return fmt.Errorf("empty")
	}
	if len(s) > maxNameLen {
		return fmt.Errorf("%d bytes, more than %d", len(s), maxNameLen)
	}
	if i := strings.IndexFunc(s, func(c rune) bool { return !unicode.IsPrint(c) || unicode.IsSpace(c) }); i >= 0 {
		return fmt.Errorf("%q has character %q at %d (no spaces or control characters)", s, s[i], i)
	}
	return nil
}

// tag is the hash tag of a pool and of every version group of it.
func (r *Registry) tag(pool string) string {
	base, _ := SplitGroup(pool)
	return "{" + r.opts.Prefix + ":" + base + "}"
}

// Key returns the full name of one of a pool's keys, e.g. Key("chromium",
// "lifetime") == "{grid:chromium}:lifetime" (for redis-cli users and tests).
// A version group's keys carry the group after the tag, in the pool's
// slot: Key("chromium@1.65", "lifetime") == "{grid:chromium}:v=1.65:lifetime".
// The config hash (limits, epoch) is the pool's, shared by its groups.
func (r *Registry) Key(pool, name string) string {
	base, version := SplitGroup(pool)
	if version == "" || poolWide[name] {
		return r.tag(base) + ":" + name
	}
	return r.tag(base) + ":v=" + version + ":" + name
}

func (r *Registry) poolKeys(pool string) []string {
	keys := make([]string, len(poolKeyNames))
	for i, n := range poolKeyNames {
		keys[i] = r.Key(pool, n)
	}
	return keys
}

// channel is the pool's wake-up channel, one for the pool and all its
// version groups: a slot freed in any group wakes the pool's waiters (a
// wake-up is a hint; a waiter of another group claims nothing and waits on).
func (r *Registry) channel(pool string) string {
	base, _ := SplitGroup(pool)
	return r.Key(base, keyWakeup)
}

func (r *Registry) poolsKey() string { return "{" + r.opts.Prefix + "}:pools" }
