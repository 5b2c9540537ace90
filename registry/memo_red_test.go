package registry

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Red-team tests of the batch memo (common.lua, MEMO): what an attacker
// with Redis write access or an operator changing limits under load can
// make a batch's calls see that the same calls sent alone would not.

// TestMemoRedRecordExtraFields: a record written by hand (or by an
// attacker) with fields named after the figures a script keeps on a
// worker it loaded (fs_len, fs_sum, fs_win, durations, fs_counted) is
// read as the record, not as those figures: each call of a batch that
// reads it again (its decoded fields kept and copied) gets what the same
// call alone gets, and neither takes the record's word for the
// fair-share estimate (the pool's default, 30 s, for a worker with no
// sessions, not the 5000 s the record claims).
func TestMemoRedRecordExtraFields(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	ctx := context.Background()
	const n = 5
	req := ClaimRequest{Policy: FairShare, Holder: "t"}
	// run makes n claims of pool's one worker, whose record carries the
	// extra fields, alone or in one batch, and returns how far each
	// claim moved the worker's predicted end (the estimate it charged).
	run := func(pool string, batched bool) []time.Duration {
		register(t, r, pool, "solo", 0)
		key := r.Key(pool, keyWorkers)
		rec, err := rdb.HGet(ctx, key, "solo").Result()
		if err != nil {
			t.Fatal(err)
		}
		rec = strings.TrimSuffix(rec, "}") + `,"fs_len":1,"fs_sum":5000000,"fs_win":20,"durations":[5000000],"fs_counted":true}`
		if err := rdb.HSet(ctx, key, "solo", rec).Err(); err != nil {
			t.Fatal(err)
		}
		// no hot figures (a version before them, or Redis lost them):
		// the next claim counts the durations list
		if err := rdb.HDel(ctx, r.Key(pool, keyHot), "solo").Err(); err != nil {
			t.Fatal(err)
		}
		claims := make([]*Claim, n)
		claim := func(i int) {
			req := req
			req.Pool = pool
			c, err := r.Claim(ctx, req)
			if err != nil {
				t.Errorf("%s claim %d: %v", pool, i, err)
			}
			claims[i] = c
		}
		if batched {
			batchOf{pool: pool, n: n, inOrder: true}.calls(t, r, scriptClaim, claim)
		} else {
			for i := range n {
				claim(i)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
		var moved []time.Duration
		for i := 1; i < n; i++ {
			moved = append(moved, claims[i].Worker.PredictedEnd.Sub(claims[i-1].Worker.PredictedEnd))
		}
		for _, c := range claims {
			if err := r.Release(ctx, pool, c.LeaseID); err != nil {
				t.Fatal(err)
			}
		}
		noDrift(t, r, rdb, pool)
		return moved
	}
	alone, batched := run("memo-extra-alone", false), run("memo-extra-batched", true)
	if !reflect.DeepEqual(alone, batched) {
		t.Errorf("each batched claim moved the predicted end by %v, the same claims alone by %v", batched, alone)
	}
	for i, d := range alone {
		if d != 30*time.Second {
			t.Errorf("claim %d alone moved the predicted end by %v, want the default estimate 30s "+
				"(the record's own fields taken as the worker's figures)", i+1, d)
		}
	}
}
