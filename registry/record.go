package registry

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

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

// rawWorker is one worker's stored values as read.lua returns them.
type rawWorker struct {
	id, record, active, lifetime, durations, command string
}

// decodeWorker parses a worker's stored values; now (ms) decides whether its
// command has expired.
func decodeWorker(pool string, raw rawWorker, now int64) (WorkerInfo, error) {
	if raw.record == "" {
		return WorkerInfo{}, fmt.Errorf("record missing")
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(raw.record), &m); err != nil || m == nil {
		return WorkerInfo{}, fmt.Errorf("record is not a JSON object")
	}
	nums := map[string]int64{}
	for _, f := range recordNumbers {
		v, ok := m[f]
		if !ok {
			return WorkerInfo{}, fmt.Errorf("field %s is missing", f)
		}
		x, isNum := v.(float64)
		if !isNum || x < 0 || x != math.Floor(x) || x >= 1<<53 {
			return WorkerInfo{}, fmt.Errorf("field %s is not a whole number (%T)", f, v)
		}
		nums[f] = int64(x)
	}
	strs := map[string]string{}
	for _, f := range recordStrings {
		s, ok := m[f].(string)
		if !ok {
			return WorkerInfo{}, fmt.Errorf("field %s is missing or not a string", f)
		}
		strs[f] = s
	}
	st := selection.Status(strs["status"])
	if st != selection.Available && st != selection.Draining {
		return WorkerInfo{}, fmt.Errorf("unknown status %q", st)
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
	w := WorkerInfo{
		Pool:              pool,
		PlaywrightVersion: groupVersion(pool),
		ID:                raw.id,
		BrowserType:       strs["browser"],
		Addr:              strs["addr"],
		Path:              strs["path"],
		Status:            st,
		Active:            int(active),
		Lifetime:          int(lifetime),
		Capacity:          int(nums["capacity"]),
		VirtualNodes:      int(nums["vnodes"]),
		LastHeartbeat:     msTime(nums["heartbeat"]),
		RegisteredAt:      msTime(nums["registered"]),
		SuspectUntil:      msTime(nums["suspect_until"]),
		PredictedEnd:      msTime(nums["predicted_end"]),
		Durations:         durs,
		Command:           liveCommand(raw.command, now),
		ExpiresAt:         msTime(nums["expires"]),
		gen:               strs["gen"],
	}
	// The signature is optional: a record without one (or with one that
	// is not a string) is unsigned, which only a proxy with a secret
	// refuses.
	w.sig, _ = m["sig"].(string)
	return w, nil
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
	var out []time.Duration
	for _, p := range strings.Split(s, ",") {
		if p == "" {
			continue
		}
		n, err := parseCount(p)
		if err != nil {
			return nil, fmt.Errorf("durations are not whole numbers")
		}
		out = append(out, time.Duration(n)*time.Millisecond)
	}
	return out, nil
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
