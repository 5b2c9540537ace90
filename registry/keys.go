package registry

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The key schema (docs/design.md, "Mechanisms"; docs/redis.md shows them
// with redis-cli). A pool's keys share the hash tag "{<prefix>:<pool>}",
// so every call touches one Redis Cluster slot. A Playwright version
// group's own keys carry the group after the tag:
// "{grid:chromium}:v=1.65:workers".
const (
	// Per version group.
	keyWorkers  = "workers"       // HASH id -> record (JSON)
	keyState    = "state"         // HASH id -> figures (common.lua); "<id> f" fair share history; " schema"; " iwrr" cursor
	keyRetiring = "retiring"      // SET workers retiring whose replacement is not serving
	keyIdxLF    = "idx:lifetime"  // ZSET lifetime-first order
	keyIdxRing  = "idx:ring"      // ZSET (lex) "<position>:<id>"
	keyIdxIdle  = "idx:fair_idle" // ZSET fair share, predicted end passed, by estimate
	keyIdxBusy  = "idx:fair_busy" // ZSET fair share, by predicted end + estimate
	keyIdxIWRR  = "idx:iwrr"      // ZSET (lex) "<weight>:<id>"
	// Per pool.
	keySessions = "sessions"      // HASH session id -> record (common.lua)
	keySIndex   = "session_index" // ZSET (lex) "w <worker> <session>", "c <client> <session>"
	keyGroups   = "groups"        // SET the pool's version groups ("-": the pool itself)
	keyQueue    = "queue"         // ZSET waiter -> arrival number (common.lua)
	keyQAlive   = "queue_alive"   // ZSET waiter -> deadline (Unix ms)
	keyQInfo    = "queue_info"    // HASH waiter -> grant, joined, versions, avoid; " seq", " served"
	// Global: the directory's list of pools, outside any pool's slot.
	keyPools = "pools" // SET
	// Pub/sub channels (not keys).
	chanWakeup = "wakeup" // per pool: a slot may have freed
	chanAgent  = "agent"  // per worker: "<group prefix>:agent:<id>", the agent's commands
)

// groupKeyNames is the KEYS layout every function takes (common.lua's
// keyset), in order. The first eight are the group's, the rest the pool's.
var groupKeyNames = []string{
	keyWorkers, keyState, keyRetiring, keyIdxLF, keyIdxRing, keyIdxIdle, keyIdxBusy, keyIdxIWRR,
	keySessions, keySIndex, keyGroups, keyQueue, keyQAlive, keyQInfo,
}

// poolWide are the keys a pool's version groups share with the pool.
var poolWide = map[string]bool{keySessions: true, keySIndex: true, keyGroups: true, keyQueue: true, keyQAlive: true, keyQInfo: true}

// maxNameLen bounds pool names, worker and session IDs.
const maxNameLen = 200

// groupSep separates a pool from its version in a group's name.
const groupSep = "@"

// GroupPool names pool's group of workers serving a Playwright version
// ("1.65"): "chromium@1.65". An empty version is the pool itself.
func GroupPool(pool, version string) string {
	if version == "" {
		return pool
	}
	return pool + groupSep + version
}

// SplitGroup splits a group name into its pool and version ("" for the
// pool itself).
func SplitGroup(group string) (pool, version string) {
	pool, version, _ = strings.Cut(group, groupSep)
	return pool, version
}

// CheckPool reports why a pool or group name cannot be used (nil: it can):
// 1-200 letters, digits, '.', '_' and '-', and an optional
// "@<major>.<minor>" version. A set of pools in Redis may hold names a
// Redis writer put there; views skip those.
func CheckPool(group string) error {
	pool, version, grouped := strings.Cut(group, groupSep)
	if grouped {
		if err := CheckVersion(version); err != nil {
			return fmt.Errorf("invalid pool name %q: %w", group, err)
		}
	}
	if pool == "" || len(pool) > maxNameLen {
		return fmt.Errorf("invalid pool name %q: want 1-%d characters", group, maxNameLen)
	}
	for _, c := range pool {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("invalid pool name %q: %q is not allowed (letters, digits, '.', '_', '-')", group, c)
		}
	}
	return nil
}

// CheckID reports why a worker or session ID cannot be used: it must be
// 1-200 bytes of printable UTF-8 without spaces (IDs are joined with spaces
// in the registry's values) or ';' (the Grid-Claim header's separator).
func CheckID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("invalid id: empty")
	case len(id) > maxNameLen:
		return fmt.Errorf("invalid id: %d bytes, more than %d", len(id), maxNameLen)
	case !utf8.ValidString(id):
		return fmt.Errorf("invalid id %q: not valid UTF-8", id)
	}
	if i := strings.IndexFunc(id, func(c rune) bool { return !unicode.IsPrint(c) || unicode.IsSpace(c) || c == ';' }); i >= 0 {
		return fmt.Errorf("invalid id %q: character %q at %d (no spaces, ';' or control characters)", id, id[i], i)
	}
	return nil
}

// tag is the hash tag of a pool and of every version group of it.
func (r *Registry) tag(group string) string {
	pool, _ := SplitGroup(group)
	return "{" + r.prefix + ":" + pool + "}"
}

// Key returns the full name of one of a group's keys, e.g.
// Key("chromium@1.65", "state") == "{grid:chromium}:v=1.65:state" (for
// redis-cli users and tests). The pool-wide keys ignore the version.
func (r *Registry) Key(group, name string) string {
	_, version := SplitGroup(group)
	if version == "" || poolWide[name] {
		return r.tag(group) + ":" + name
	}
	return r.tag(group) + ":v=" + version + ":" + name
}

// keys is the KEYS layout of a call on group.
func (r *Registry) keys(group string) []string {
	out := make([]string, len(groupKeyNames))
	for i, name := range groupKeyNames {
		out[i] = r.Key(group, name)
	}
	return out
}

// WakeupChannel is the pub/sub channel on which a pool's freed slots and
// new workers are announced.
func (r *Registry) WakeupChannel(pool string) string { return r.tag(pool) + ":" + chanWakeup }

// AgentChannel is the pub/sub channel on which a worker's agent hears its
// commands (an operator's drain, a session to end).
func (r *Registry) AgentChannel(group, id string) string {
	return strings.TrimSuffix(r.Key(group, keyWorkers), keyWorkers) + chanAgent + ":" + id
}

func (r *Registry) poolsKey() string { return "{" + r.prefix + "}:" + keyPools }
