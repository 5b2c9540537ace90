package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// leaseEstimate is the estimate (ms) claim c stored in its lease: the
// fair-share estimate its worker had when it was claimed.
func leaseEstimate(t *testing.T, r *Registry, c *Claim) int64 {
	t.Helper()
	raw, err := r.rdb.HGet(context.Background(), r.Key("p", keyLeases), c.LeaseID).Result()
	if err != nil {
		t.Fatal(err)
	}
	var l struct{ Est int64 }
	if err := json.Unmarshal([]byte(raw), &l); err != nil {
		t.Fatal(err)
	}
	return l.Est
}

// wantEstimate is selection's estimate over a stored durations string:
// the mean (floor) or median of the last window entries, def with none.
func wantEstimate(t *testing.T, stored string, window int, median bool, def int64) int64 {
	t.Helper()
	var d []int64
	for _, s := range strings.Split(stored, ",") {
		if s == "" {
			continue
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("stored durations %q", stored)
		}
		d = append(d, n)
	}
	if len(d) > window {
		d = d[len(d)-window:]
	}
	if len(d) == 0 {
		return def
	}
	if median {
		slices.Sort(d)
		if len(d)%2 == 1 {
			return d[len(d)/2]
		}
		return (d[len(d)/2-1] + d[len(d)/2]) / 2
	}
	var s int64
	for _, x := range d {
		s += x
	}
	return s / int64(len(d))
}

// The fair-share estimate comes from running figures kept beside the
// durations list (the hot hash), not from parsing the list: it must stay
// the list's estimate whatever happens to the list or the figures — a
// release that keeps the last DurationWindow entries (shorter, equal to or
// longer than the fair-share window), an operator's edit, a list Redis
// lost, figures Redis lost, a change of window or of mode.
func TestFairShareEstimateFollowsTheDurations(t *testing.T) {
	ctx := context.Background()
	for _, kept := range []int{2, 3, 5} {
		t.Run(fmt.Sprintf("kept %d", kept), func(t *testing.T) {
			r, rdb := startRegistry(t, Options{DurationWindow: kept})
			register(t, r, "p", "w", 0)
			durKey, hotKey := r.Key("p", keyDurations), r.Key("p", keyHot)
			base := time.Now().Add(-time.Hour)
			const def = 30000
			for i := 1; i <= 14; i++ {
				window, median := 3, false
				switch i {
				case 4:
					// an operator's edit (untidy, too)
					rdb.HSet(ctx, durKey, "w", "100,,200,700,")
				case 6:
					rdb.HDel(ctx, durKey, "w") // Redis lost the list
				case 8:
					rdb.HDel(ctx, hotKey, "w") // Redis lost the figures
				case 9:
					rdb.HSet(ctx, hotKey, "w", "0 0 3 9 99999 nonsense") // figures of another list
				case 10:
					window = 2 // the pool's window changes
				case 11:
					window = 2
					median = true
				case 12:
					window = 2
					rdb.HSet(ctx, durKey, "w", "5") // edited to fewer entries than kept
				}
				stored, _ := rdb.HGet(ctx, durKey, "w").Result()
				now := base.Add(time.Duration(i) * time.Second)
				c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: FairShare, Now: now,
					FairShare: selection.FairShare{Window: window, Median: median, Default: def * time.Millisecond}})
				if err != nil {
					t.Fatal(err)
				}
				want := wantEstimate(t, stored, window, median, def)
				if got := leaseEstimate(t, r, c); got != want {
					t.Fatalf("claim %d: estimate %d over %q (window %d, median %v), want %d", i, got, stored, window, median, want)
				}
				if err := r.Release(ctx, "p", c.LeaseID); err != nil {
					t.Fatal(err)
				}
				after, _ := rdb.HGet(ctx, durKey, "w").Result()
				if n := len(strings.Split(after, ",")); n > kept {
					t.Fatalf("release %d: stored %q, more than %d entries", i, after, kept)
				}
			}
		})
	}
}

// A claim and a release leave the record's JSON as it is: the predicted
// end and a suspicion go to the hot hash, which every read (the claim's
// reply, Worker, Inspect) takes them from.
func TestClaimAndReleaseLeaveTheRecord(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	register(t, r, "p", "w", 0)
	recKey := r.Key("p", keyWorkers)
	before, err := rdb.HGet(ctx, recKey, "w").Result()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().Truncate(time.Millisecond)
	c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: FairShare, Now: now,
		FairShare: selection.FairShare{Window: 20, Default: 7 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if want := now.Add(7 * time.Second); !c.Worker.PredictedEnd.Equal(want) {
		t.Fatalf("claim's worker predicted end %v, want %v", c.Worker.PredictedEnd, want)
	}
	if after, _ := rdb.HGet(ctx, recKey, "w").Result(); after != before {
		t.Fatalf("the claim rewrote the record:\n%s\n%s", before, after)
	}
	w, err := r.Worker(ctx, "p", "w")
	if err != nil || !w.PredictedEnd.Equal(now.Add(7*time.Second)) {
		t.Fatalf("Worker after the claim: predicted end %v, %v", w.PredictedEnd, err)
	}
	if err := r.Undo(ctx, "p", c.LeaseID, time.Minute); err != nil {
		t.Fatal(err)
	}
	if after, _ := rdb.HGet(ctx, recKey, "w").Result(); after != before {
		t.Fatalf("the undo rewrote the record:\n%s\n%s", before, after)
	}
	info, err := r.Inspect(ctx, "p")
	if err != nil || len(info.Workers) != 1 || time.Until(info.Workers[0].SuspectUntil) < 50*time.Second {
		t.Fatalf("Inspect after an undo: %+v %v", info.Workers, err)
	}
	// a heartbeat rewrites the record, with copies of the hot figures for
	// versions that read only the record
	if _, err := r.Heartbeat(ctx, "p", "w", time.Minute); err != nil {
		t.Fatal(err)
	}
	var rec struct {
		SuspectUntil int64 `json:"suspect_until"`
	}
	raw, _ := rdb.HGet(ctx, recKey, "w").Result()
	if err := json.Unmarshal([]byte(raw), &rec); err != nil || rec.SuspectUntil != toMS(info.Workers[0].SuspectUntil) {
		t.Fatalf("record after a heartbeat: %s (%v), want suspect_until %d", raw, err, toMS(info.Workers[0].SuspectUntil))
	}
}

// A record written by a version without hot figures (predicted_end and
// suspect_until in its JSON, no hot value) still decodes, in Go and in
// the scripts: its figures are the record's until a claim or release
// writes hot ones. Figures that do not parse leave the record's in force.
func TestRecordWithoutHotFigures(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	now := time.Now().Truncate(time.Millisecond)
	end, suspect := now.Add(5*time.Second), now.Add(-time.Second)
	put(t, r, "p", selection.Worker{ID: "w", Status: selection.Available, LastHeartbeat: now,
		PredictedEnd: end, SuspectUntil: suspect, Durations: []time.Duration{time.Second, 3 * time.Second}}, 0, time.Time{})
	if n, _ := rdb.HExists(ctx, r.Key("p", keyHot), "w").Result(); n {
		t.Fatal("put left hot figures")
	}
	w, err := r.Worker(ctx, "p", "w")
	if err != nil || !w.PredictedEnd.Equal(end) || !w.SuspectUntil.Equal(suspect) {
		t.Fatalf("Worker: %+v %v", w, err)
	}
	c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: FairShare, Now: now, FairShare: selection.FairShare{Window: 20}})
	if err != nil {
		t.Fatal(err)
	}
	// the queue goes on from the record's predicted end, by the mean of 1s and 3s
	if want := end.Add(2 * time.Second); !c.Worker.PredictedEnd.Equal(want) {
		t.Fatalf("claim: predicted end %v, want %v", c.Worker.PredictedEnd, want)
	}
	for _, bad := range []string{"x", "1", "1 2 3", "12345678901234567 0", "1 2 3 4 x y"} {
		rdb.HSet(ctx, r.Key("p", keyHot), "w", bad)
		w, err := r.Worker(ctx, "p", "w")
		if err != nil || !w.PredictedEnd.Equal(end) {
			t.Fatalf("hot %q: Worker %+v %v, want the record's predicted end %v", bad, w, err, end)
		}
	}
}

// parseHot accepts exactly what load_worker's patterns and count() do.
func TestParseHot(t *testing.T) {
	for s, want := range map[string]bool{
		"1 2": true, "0 0 20 3 600 100,200,300": true, "1 2 3 4 5 ": true, "1 2 3 4 5 a b": true,
		"": false, "1": false, "1 2 ": false, "1 2 3": false, "a 2": false, "1 2 3 4 x y": false,
		"1  2": false, "-1 2": false, "1234567890123456 2": false, "1 2 3 4 5": false,
	} {
		if _, _, ok := parseHot(s); ok != want {
			t.Errorf("parseHot(%q) ok = %v, want %v", s, ok, want)
		}
	}
	if e, s, _ := parseHot("10 20 3 4 5 x"); e != 10 || s != 20 {
		t.Errorf("parseHot: %d %d", e, s)
	}
}
