package registry

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// A worker record as stored in the pool's workers hash (JSON, written by
// lua/register.lua and kept by the other scripts). Times are Unix ms.
// decodeWorker applies the same rules as decode/load_worker in
// lua/common.lua, so Go and Lua agree on what a bad record is.
var (
	recordNumbers = []string{"capacity", "vnodes", "heartbeat", "registered", "expires", "suspect_until", "predicted_end"}
	recordStrings = []string{"id", "browser", "addr", "path", "gen", "status"}
)

// rawWorker is one worker's stored values as read.lua returns them. hot
// is its hot figures ("" when none: see parseHot).
type rawWorker struct {
	id, record, active, lifetime, durations, command, hot string
}

// decodeWorker parses a worker's stored values; now (ms) decides whether its
// command has expired. Every claim decodes its worker, so the usual record
// (what the scripts' cjson.encode writes: one flat object, no escape but
// "\/" unless a value has a control character, '"' or '\\', valid UTF-8)
// takes a fast path, a scan of the string that allocates little (a string
// with "\/" is copied); any other record takes the map path
// (encoding/json), whose rules are the definition. FuzzDecodeWorkerPaths
// checks they agree.
func decodeWorker(pool string, raw rawWorker, now int64) (WorkerInfo, error) {
	if raw.record == "" {
		return WorkerInfo{}, fmt.Errorf("record missing")
	}
	var nums [7]int64
	var strs [6]string
	var sig string
	var err error
	handled := false
	if plainRecord(raw.record) {
		handled, err = decodeRecordFast(raw.record, &nums, &strs, &sig)
	}
	if !handled {
		err = decodeRecordMap(raw.record, &nums, &strs, &sig)
	}
	if err != nil {
		return WorkerInfo{}, err
	}
	st := selection.Status(strs[5])
	if st != selection.Available && st != selection.Draining {
		return WorkerInfo{}, fmt.Errorf("unknown status %q", st)
	}
	// as bad_name in lua/common.lua: an id or generation is joined with
	// spaces in lease_owner's members, so a claim refuses such a record
	for _, f := range [2]int{0, 4} {
		if badName(strs[f]) {
			return WorkerInfo{}, fmt.Errorf("field %s is empty, longer than 200 bytes or has spaces or control characters", recordStrings[f])
		}
	}
	// The hash field names the worker everywhere (claims, leases, the
	// admin API): a record stored under another name than its own id (a
	// hand copy, or a field name carrying terminal escapes) is not one.
	if raw.id != strs[0] {
		return WorkerInfo{}, fmt.Errorf("stored under another name than its id")
	}
	active, err := parseCount(raw.active)
	if err != nil {
		return WorkerInfo{}, fmt.Errorf("active count is missing or not a whole number")
	}
	lifetime, err := parseCount(raw.lifetime)
	if err != nil {
		return WorkerInfo{}, fmt.Errorf("lifetime count is missing or not a whole number")
	}
	durs, err := parseDurations(raw.durations)
	if err != nil {
		return WorkerInfo{}, err
	}
	// The hot figures, when there are any, are the worker's predicted end
	// and suspicion; the record's copies may be a heartbeat old. The later
	// suspicion holds, as in load_worker: an older version's undo (or a
	// hand edit) writes only the record's.
	if end, suspect, ok := parseHot(raw.hot); ok {
		nums[5], nums[6] = max(suspect, nums[5]), end
	}
	// recordNumbers: capacity, vnodes, heartbeat, registered, expires,
	// suspect_until, predicted_end; recordStrings: id, browser, addr, path,
	// gen, status.
	w := WorkerInfo{
		Pool:              pool,
		PlaywrightVersion: groupVersion(pool),
		ID:                raw.id,
		BrowserType:       strs[1],
		Addr:              strs[2],
		Path:              strs[3],
		Status:            st,
		Active:            int(active),
		Lifetime:          int(lifetime),
		Capacity:          int(nums[0]),
		VirtualNodes:      int(nums[1]),
		LastHeartbeat:     msTime(nums[2]),
		RegisteredAt:      msTime(nums[3]),
		SuspectUntil:      msTime(nums[5]),
		PredictedEnd:      msTime(nums[6]),
		Durations:         durs,
		Command:           liveCommand(raw.command, now),
		ExpiresAt:         msTime(nums[4]),
		gen:               strs[4],
		// The signature is optional: a record without one (or with one
		// that is not a string) is unsigned, which only a proxy with a
		// secret refuses.
		sig: sig,
	}
	return w, nil
}

// badName is bad_name of lua/common.lua: empty, over 200 bytes, or holding
// a space or a control character (Lua's %s and %c: bytes up to 0x20, and
// 0x7f).
func badName(s string) bool {
	if s == "" || len(s) > 200 {
		return true
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] == 0x7f {
			return true
		}
	}
	return false
}

// decodeRecordMap reads a record the general way (the rules' definition):
// numbers in recordNumbers' order, strings in recordStrings' order, the
// optional sig.
func decodeRecordMap(record string, nums *[7]int64, strs *[6]string, sig *string) error {
	var m map[string]any
	if err := json.Unmarshal([]byte(record), &m); err != nil || m == nil {
		return fmt.Errorf("record is not a JSON object")
	}
	for i, f := range recordNumbers {
		v, ok := m[f]
		if !ok {
			return fmt.Errorf("field %s is missing", f)
		}
		x, isNum := v.(float64)
		if !isNum || x < 0 || x != math.Floor(x) || x >= 1<<53 {
			return fmt.Errorf("field %s is not a whole number (%T)", f, v)
		}
		nums[i] = int64(x)
	}
	for i, f := range recordStrings {
		s, ok := m[f].(string)
		if !ok {
			return fmt.Errorf("field %s is missing or not a string", f)
		}
		strs[i] = s
	}
	*sig, _ = m["sig"].(string)
	return nil
}

// plainRecord reports whether a record can take the fast path: no escape
// but "\/", and no invalid UTF-8, so that every string (keys included) is
// its bytes between the quotes with "\/" read as "/" (Redis's cjson writes
// every "/" that way: every path, so a record the scripts wrote has one;
// it writes other bytes above 0x7f as they are, and encoding/json, like
// the fast path, matches a key to a map's exactly); outside strings, no
// upper-case letter (no "E" exponent) and no byte above 0x7f; and no number
// with an exponent or of 300 digits or more, the only numbers that can
// fall outside float64's range (encoding/json refuses a record holding one
// under any key, which the fast path, skipping unknown keys, would not see).
func plainRecord(record string) bool {
	inString, digits, high := false, 0, false
	for i := 0; i < len(record); i++ {
		c := record[i]
		if c >= 0x80 || (c >= 'A' && c <= 'Z') {
			if !inString {
				return false
			}
			high = high || c >= 0x80
			continue
		}
		if c == '\\' {
			if !inString || i+1 == len(record) || record[i+1] != '/' {
				return false
			}
			i++
			continue
		}
		switch {
		case c == '"':
			inString, digits = !inString, 0
		case inString:
		case c >= '0' && c <= '9':
			if digits++; digits >= 300 {
				return false
			}
		case c == 'e' && i > 0 && (record[i-1] == '.' || (record[i-1] >= '0' && record[i-1] <= '9')):
			return false
		default:
			digits = 0
		}
	}
	// encoding/json reads a string's invalid UTF-8 as U+FFFD; the fast
	// path would keep its bytes
	return !high || utf8.ValidString(record)
}

// recordKeys is every field a record's scan keeps: recordNumbers, then
// recordStrings, then sig.
var recordKeys = append(append(append([]string(nil), recordNumbers...), recordStrings...), "sig")

// scanFlatRecord reads a plain record (see plainRecord) that is one flat
// JSON object whose values are strings, numbers, true, false or null, into
// the raw text of each of recordKeys' values ("" when absent; a later
// duplicate key wins, as with encoding/json). ok is false for anything
// else, valid or not (nested values, bad syntax): the caller then takes
// the map path, which says what is wrong.
func scanFlatRecord(s string, vals *[14]string) bool {
	i := 0
	ws := func() {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
			i++
		}
	}
	str := func() (string, bool) { // at '"'; no escape but "\/" in a plain record
		j := i + 1
		for j < len(s) && s[j] != '"' {
			if s[j] < 0x20 {
				return "", false
			}
			if s[j] == '\\' {
				if j+1 == len(s) || s[j+1] != '/' {
					return "", false
				}
				j++
			}
			j++
		}
		if j == len(s) {
			return "", false
		}
		v := s[i : j+1]
		i = j + 1
		return v, true
	}
	ws()
	if i == len(s) || s[i] != '{' {
		return false
	}
	i++
	ws()
	if i < len(s) && s[i] == '}' {
		i++
	} else {
		for {
			if i == len(s) || s[i] != '"' {
				return false
			}
			k, ok := str()
			if !ok {
				return false
			}
			ws()
			if i == len(s) || s[i] != ':' {
				return false
			}
			i++
			ws()
			if i == len(s) {
				return false
			}
			start := i
			switch c := s[i]; {
			case c == '"':
				if _, ok := str(); !ok {
					return false
				}
			case c == 't' && strings.HasPrefix(s[i:], "true"):
				i += 4
			case c == 'f' && strings.HasPrefix(s[i:], "false"):
				i += 5
			case c == 'n' && strings.HasPrefix(s[i:], "null"):
				i += 4
			case c == '-' || (c >= '0' && c <= '9'):
				if !scanNumber(s, &i) {
					return false
				}
			default:
				return false
			}
			key := k[1 : len(k)-1]
			for n, name := range recordKeys {
				if key == name {
					vals[n] = s[start:i]
					break
				}
			}
			ws()
			if i == len(s) {
				return false
			}
			if s[i] == '}' {
				i++
				break
			}
			if s[i] != ',' {
				return false
			}
			i++
			ws()
		}
	}
	ws()
	return i == len(s)
}

// scanNumber moves *i past a JSON number without an exponent
// (-?(0|[1-9][0-9]*)(.[0-9]+)?); false when there is none, or an exponent
// follows (plainRecord sends those to the map path anyway).
func scanNumber(s string, i *int) bool {
	j := *i
	if s[j] == '-' {
		j++
	}
	digits := func() int {
		n := 0
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
			n++
		}
		return n
	}
	if j < len(s) && s[j] == '0' {
		j++
	} else if digits() == 0 {
		return false
	}
	if j < len(s) && s[j] == '.' {
		j++
		if digits() == 0 {
			return false
		}
	}
	if j < len(s) && (s[j] == 'e' || s[j] == 'E') {
		return false
	}
	*i = j
	return true
}

// decodeRecordFast is decodeRecordMap for a plain record; handled is false
// when the record is not a flat object (decodeRecordMap then decides).
func decodeRecordFast(record string, nums *[7]int64, strs *[6]string, sig *string) (handled bool, err error) {
	var v [14]string
	if !scanFlatRecord(record, &v) {
		return false, nil
	}
	for i := range recordNumbers {
		x := v[i]
		if x == "" {
			return true, fmt.Errorf("field %s is missing", recordNumbers[i])
		}
		if c := x[0]; c != '-' && (c < '0' || c > '9') {
			return true, fmt.Errorf("field %s is not a whole number (%s)", recordNumbers[i], rawType(c))
		}
		f, err := strconv.ParseFloat(x, 64)
		if err != nil {
			// out of float64's range: encoding/json refuses the record
			return true, fmt.Errorf("record is not a JSON object")
		}
		if f < 0 || f != math.Floor(f) || f >= 1<<53 {
			return true, fmt.Errorf("field %s is not a whole number (float64)", recordNumbers[i])
		}
		nums[i] = int64(f)
	}
	for i := range recordStrings {
		x := v[7+i]
		if len(x) < 2 || x[0] != '"' {
			return true, fmt.Errorf("field %s is missing or not a string", recordStrings[i])
		}
		strs[i] = unslash(x[1 : len(x)-1])
	}
	if x := v[13]; len(x) >= 2 && x[0] == '"' {
		*sig = unslash(x[1 : len(x)-1])
	}
	return true, nil
}

// unslash reads a plain record's string: its bytes, "\/" being "/".
func unslash(s string) string {
	if !strings.Contains(s, `\/`) {
		return s
	}
	return strings.ReplaceAll(s, `\/`, "/")
}

// rawType names the Go type encoding/json gives a JSON value starting with
// c when it decodes into any (for the same message as the map path).
func rawType(c byte) string {
	switch c {
	case '"':
		return "string"
	case 't', 'f':
		return "bool"
	case 'n':
		return "<nil>"
	case '{':
		return "map[string]interface {}"
	case '[':
		return "[]interface {}"
	}
	return "float64"
}

// parseCount reads a stored counter: decimal digits only, as count() in
// lua/common.lua.
func parseCount(s string) (int64, error) {
	if s == "" || len(s) > 15 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("not a whole number: %q", s)
	}
	return strconv.ParseInt(s, 10, 64)
}

func parseDurations(s string) ([]time.Duration, error) {
	if s == "" {
		return nil, nil
	}
	out := make([]time.Duration, 0, strings.Count(s, ",")+1)
	for rest := s; rest != ""; {
		var p string
		p, rest, _ = strings.Cut(rest, ",")
		if p == "" {
			continue
		}
		n, err := parseCount(p)
		if err != nil {
			return nil, fmt.Errorf("durations are not whole numbers")
		}
		out = append(out, time.Duration(n)*time.Millisecond)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// parseHot reads a worker's hot figures (the pool's hot hash, written by
// lua/common.lua's store_hot): "<predicted end> <suspect until>", then
// optionally " <window> <count> <window sum> <durations>". ok is false
// for anything else, as load_worker's patterns and count() decide: the
// record's copies of the two figures are used then.
func parseHot(s string) (end, suspect int64, ok bool) {
	parts := strings.SplitN(s, " ", 6)
	if len(parts) != 2 && len(parts) != 6 {
		return 0, 0, false
	}
	digits := parts
	if len(parts) == 6 {
		digits = parts[:5]
	}
	for _, p := range digits {
		if p == "" || strings.TrimLeft(p, "0123456789") != "" {
			return 0, 0, false
		}
	}
	end, err1 := parseCount(parts[0])
	suspect, err2 := parseCount(parts[1])
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return end, suspect, true
}

// liveCommand reads "name|expires ms"; "" once expired or malformed.
func liveCommand(s string, now int64) Command {
	name, exp, ok := strings.Cut(s, "|")
	if !ok {
		return ""
	}
	n, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || n < now {
		return ""
	}
	return Command(name)
}

// msTime converts Unix ms to a time; 0 is the zero time.
func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// toMS converts a time to Unix ms; the zero time is 0.
func toMS(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// snapshot implements WorkerInfo.Snapshot.
func (w WorkerInfo) snapshot() selection.Worker {
	return selection.Worker{
		ID:            w.ID,
		Status:        w.Status,
		Active:        w.Active,
		Lifetime:      w.Lifetime,
		Capacity:      w.Capacity,
		LastHeartbeat: w.LastHeartbeat,
		SuspectUntil:  w.SuspectUntil,
		Durations:     append([]time.Duration(nil), w.Durations...),
		PredictedEnd:  w.PredictedEnd,
	}
}

// groupVersion is the Playwright version of a group name ("" for a pool).
func groupVersion(name string) string {
	_, v := SplitGroup(name)
	return v
}
