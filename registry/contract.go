package registry

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// The Go↔Lua contract of the scripts Go reads replies from by name: the
// ordered ARGV fields of each request and the ordered items of each reply,
// named once here. Go builds ARGV with an argv and decodes replies with a
// reply, both by these names; the Lua side reads them by the same names
// through tables generated from these lists (contractLua), compiled into
// positions when the library is built (contractBody), so no index of
// either side is written anywhere else and names cost nothing per call. The wire stays positional (flat
// ARGV, a flat array reply): a cjson request and reply would cost 4.5–6 µs
// more per call (docs/perf/registry-profile.md, item 10).

// commonArgs are the ARGV every script gets first (lua/common.lua).
var commonArgs = []string{"now_ms", "channel", "pool"}

// claimArgs are claim.lua's own ARGV, after commonArgs; the policy's own
// arguments (PolicySpec.args) follow them, read by its walk as PARG(i).
var claimArgs = []string{
	"policy", "dry",
	// 1: store the limits and claim nothing (Registry.StoreLimits).
	"limits_only",
	// The limits the claim brings (see ClaimRequest.Limits).
	"max_concurrent", "max_lifetime", "stale_after_ms", "max_scan", "stagger",
	// ClaimRequest.DrainHold.
	"drain_hold_ms",
	// The max_scan a lifetime_first claim with this request would have:
	// the budget while the policy's index is being built (the claim then
	// walks idx:lifetime; lua/common.lua, "Kept indexes").
	"fallback_max_scan",
	// FairShare's, stored only by fair_share claims.
	"fs_window", "fs_median", "fs_default_ms",
	"lease_id", "lease_ttl_ms", "holder", "command_ttl_ms",
	"durations_kept", "lease_sweep", "config_time_ms", "config_supersedes_ms",
	"epoch_seen", "epoch_new",
	"client", "client_limit",
	// ClaimRequest.Avoid: worker IDs joined by spaces ('' none).
	"avoid",
	// How long the pool's claims are held after the data came back on
	// another server (ReassertHold; NoWorkerError.Held).
	"restore_hold_ms",
}

// claimReply is claim.lua's reply when it decided (ok 1: claimed or, dry,
// picked; ok 0: no worker). Its other replies are a code and one value:
// claimCancelled, claimReplayed (claimReplayReply), claimEpoch,
// claimClientLimit.
var claimReply = []string{
	"ok", "id", "record", "active", "lifetime", "durations", "drain",
	"scanned", "stale", "bad", "wraps", "effective", "dedupes", "tied", "now",
	// StaggerDrains held a last session back; dead retiring members.
	"retiring", "retired_stale",
	// The limits in force and whether they are not the request's.
	"overridden", "max_concurrent", "max_lifetime", "stagger", "fs_window", "fs_median", "fs_default_ms",
	"epoch",
	// The worker's hot figures (lua/common.lua, "Hot figures"): its
	// predicted end and suspicion, which the record's copies may lag.
	"hot",
	// 1: the policy's index was being built, so the claim walked
	// idx:lifetime instead (lua/common.lua, "Kept indexes").
	"building",
	// How many workers the pool has registered, read only by a claim
	// that avoided workers (ClaimRequest.Avoid) and found none; else 0.
	"registered",
	// ms the pool's claims are still held after a restore (0: not held).
	"held",
}

// The codes of claim.lua's other replies (the reply's first item).
const (
	claimCancelled   = -1 // {-1, 'cancelled'}
	claimReplayed    = -2 // claimReplayReply
	claimEpoch       = -3 // {-3, epoch}
	claimClientLimit = -4 // {-4, live sessions}
)

// claimReplayReply is the reply to a lease ID that already claimed: the
// claim it made (built by common.lua's claim_replay).
var claimReplayReply = []string{"code", "id", "record", "active", "lifetime", "durations", "drain", "now", "hot"}

// readArgs are read.lua's ARGV after commonArgs.
var readArgs = []string{"id", "cursor", "chunk"}

// readReply is read.lua's reply; rows holds readRow per worker.
var readReply = []string{"now", "leases", "config", "rows", "retiring", "cursor"}

// readRow is one worker's figures in read.lua's rows.
var readRow = []string{"id", "record", "active", "lifetime", "durations", "command", "hot"}

// layout is one ordered list of names, indexed.
type layout struct {
	names []string
	at    map[string]int
}

func newLayout(names []string) layout {
	l := layout{names: names, at: make(map[string]int, len(names))}
	for i, n := range names {
		if _, dup := l.at[n]; dup {
			panic("registry contract: field " + n + " twice")
		}
		l.at[n] = i
	}
	return l
}

func (l layout) index(name string) int {
	i, ok := l.at[name]
	if !ok {
		panic("registry contract: no field " + name + " in " + strings.Join(l.names, ","))
	}
	return i
}

var (
	claimArgsLayout   = newLayout(claimArgs)
	claimReplyLayout  = newLayout(claimReply)
	claimReplayLayout = newLayout(claimReplayReply)
	readArgsLayout    = newLayout(readArgs)
	readReplyLayout   = newLayout(readReply)
	readRowLayout     = newLayout(readRow)
)

// argv is a script's own ARGV, set by name.
type argv struct {
	l    layout
	vals []any
}

func newArgv(l layout) *argv { return &argv{l: l, vals: make([]any, len(l.names))} }

func (a *argv) set(name string, v any) *argv {
	a.vals[a.l.index(name)] = v
	return a
}

// list returns the values in order; every field must have been set.
func (a *argv) list() ([]any, error) {
	for i, v := range a.vals {
		if v == nil {
			return nil, fmt.Errorf("script argument %s not set", a.l.names[i])
		}
	}
	return a.vals, nil
}

// reply is a script's reply, read by name.
type reply struct {
	l    layout
	vals []any
}

// decodeReply checks the reply's length against its layout.
func decodeReply(l layout, res []any) (reply, error) {
	if len(res) != len(l.names) {
		return reply{}, fmt.Errorf("unexpected reply of %d items (want %d: %s)", len(res), len(l.names), strings.Join(l.names, ", "))
	}
	return reply{l: l, vals: res}, nil
}

func (r reply) get(name string) any { return r.vals[r.l.index(name)] }

func (r reply) int(name string) int64 { x, _ := r.get(name).(int64); return x }

func (r reply) flag(name string) bool { return r.int(name) == 1 }

func (r reply) str(name string) string { x, _ := r.get(name).(string); return x }

func (r reply) strs(name string) []string {
	xs, _ := r.get(name).([]any)
	if len(xs) == 0 {
		return nil
	}
	out := make([]string, 0, len(xs))
	for _, x := range xs {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// rowsLua is the Lua of a reply field that is a flat list of records:
// add_row(list, {name = value, …}) appends one record's fields in the
// order of names (an unset one is a script error).
func rowsLua(script string, names []string) string {
	var b strings.Builder
	b.WriteString("local ROW = {")
	for i, n := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(n))
	}
	b.WriteString("}\n")
	fmt.Fprintf(&b, `local function add_row(list, t)
  for _, name in ipairs(ROW) do
    local v = t[name]
    if v == nil then error('%s: row field ' .. name .. ' not set') end
    list[#list + 1] = v
  end
end
`, script)
	return b.String()
}

// contractLua is the Lua prologue of a script whose request and reply are
// named here: REQ maps each of its ARGV names to its index (read as
// ARGV[REQ.name]), PARG(i) reads the i-th argument after them, and
// reply{name = value, …} builds the reply in this order (an unset field is
// a script error, never a shifted reply). Generated, so the Lua cannot
// disagree with the lists above.
func contractLua(script string, args, rep []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "-- generated by registry/contract.go: %s's request and reply fields.\n", script)
	b.WriteString("local REQ = {")
	for i, n := range args {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s = %d", n, len(commonArgs)+i+1)
	}
	b.WriteString("}\n")
	fmt.Fprintf(&b, "local PARG_AT = %d\n", len(commonArgs)+len(args)+1)
	b.WriteString("local function PARG(i) return ARGV[PARG_AT + i - 1] end\n")
	b.WriteString("local REPLY = {")
	for i, n := range rep {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(n))
	}
	b.WriteString("}\n")
	fmt.Fprintf(&b, `local function reply(t)
  local out = {}
  for i, name in ipairs(REPLY) do
    local v = t[name]
    if v == nil then error('%s: reply field ' .. name .. ' not set') end
    out[i] = v
  end
  return out
end
`, script)
	return b.String()
}

// contractBody compiles a script body's use of its contract: each
// ARGV[REQ.<name>] becomes ARGV[<index>] and each `return reply { name =
// value, … }` becomes `return { value, … }` in rep's order, so a call pays
// neither a table lookup per argument nor a named table and its copy per
// reply (profile item 10) while the source still reads and writes names.
// A name the contract does not list, a field given twice or a field left
// out panics here, when the package loads (every test loads it). A value
// that is nil at run time ends the array there: Redis replies with the
// items before it, which decodeReply refuses (never a shifted reply).
// Line numbers are kept, so Redis' errors point at the source's lines.
func contractBody(script string, args, rep []string, body string) string {
	idx := map[string]int{}
	for i, n := range args {
		idx[n] = len(commonArgs) + i + 1
	}
	body = reqRef.ReplaceAllStringFunc(body, func(m string) string {
		name := reqRef.FindStringSubmatch(m)[1]
		i, ok := idx[name]
		if !ok {
			panic(fmt.Sprintf("registry contract: %s reads ARGV[REQ.%s], which contract.go does not list", script, name))
		}
		return strconv.Itoa(i)
	})
	const ret = "return reply {"
	var b strings.Builder
	for {
		i := strings.Index(body, ret)
		if i < 0 {
			b.WriteString(body)
			return b.String()
		}
		b.WriteString(body[:i])
		fields, n := splitTableFields(script, body[i+len(ret):])
		vals := map[string]string{}
		for _, f := range fields {
			m := fieldRe.FindStringSubmatch(f)
			if m == nil {
				panic(fmt.Sprintf("registry contract: %s: reply field %q is not `name = value`", script, strings.TrimSpace(f)))
			}
			if _, dup := vals[m[1]]; dup {
				panic(fmt.Sprintf("registry contract: %s sets reply field %s twice", script, m[1]))
			}
			vals[m[1]] = m[2]
		}
		b.WriteString("return {")
		for j, name := range rep {
			v, ok := vals[name]
			if !ok {
				panic(fmt.Sprintf("registry contract: %s's reply does not set %s", script, name))
			}
			delete(vals, name)
			if j > 0 {
				b.WriteString(", ")
			}
			// parenthesised: one value, as the named reply{} took (a call
			// last in a positional constructor would spread its results)
			b.WriteString("(" + v + ")")
		}
		for name := range vals {
			panic(fmt.Sprintf("registry contract: %s's reply sets %s, which contract.go does not list", script, name))
		}
		b.WriteString("}")
		// the same line breaks as the source's constructor
		b.WriteString(strings.Repeat("\n", strings.Count(body[i:i+len(ret)+n], "\n")))
		body = body[i+len(ret)+n:]
	}
}

var (
	reqRef  = regexp.MustCompile(`REQ\.([A-Za-z_][A-Za-z_0-9]*)`)
	fieldRe = regexp.MustCompile(`(?s)^\s*([A-Za-z_][A-Za-z_0-9]*)\s*=\s*(.*?)\s*$`)
)

// splitTableFields splits the Lua table constructor that src starts
// inside (just after its '{') into its top-level fields, and returns them
// with the length of src up to and including the closing '}'. It knows
// brackets, strings and comments, which is all a reply's values hold.
func splitTableFields(script, src string) ([]string, int) {
	var fields []string
	var cur strings.Builder
	depth := 0
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch c {
		case '(', '[', '{':
			depth++
		case ')', ']':
			depth--
		case '}':
			if depth == 0 {
				if f := cur.String(); strings.TrimSpace(f) != "" {
					fields = append(fields, f)
				}
				return fields, i + 1
			}
			depth--
		case ',':
			if depth == 0 {
				fields = append(fields, cur.String())
				cur.Reset()
				continue
			}
		case '\n':
			c = ' '
		case '\'', '"':
			j := i + 1
			for ; j < len(src) && src[j] != c; j++ {
				if src[j] == '\\' {
					j++
				}
			}
			cur.WriteString(src[i:min(j+1, len(src))])
			i = j
			continue
		case '-':
			if strings.HasPrefix(src[i:], "--") {
				// a comment: left out, up to its line's end
				j := strings.IndexByte(src[i:], '\n')
				if j < 0 {
					i = len(src)
					continue
				}
				i += j - 1
				continue
			}
		}
		cur.WriteByte(c)
	}
	panic("registry contract: " + script + ": `return reply {` is not closed")
}

// ClaimContractBody compiles a claim body's named arguments and reply as
// the registry does (contractBody), for tools that time what naming costs.
func ClaimContractBody(body string) string {
	return contractBody("claim.lua", claimArgs, claimReply, body)
}

// ClaimContractLua returns claim.lua's generated contract prologue (REQ,
// PARG, reply) with its argument and reply field names, for tools that
// time what naming costs (cmd/gridbench's redis-profile).
func ClaimContractLua() (lua string, args, reply []string) {
	return contractLua("claim.lua", claimArgs, claimReply), append([]string(nil), claimArgs...), append([]string(nil), claimReply...)
}
