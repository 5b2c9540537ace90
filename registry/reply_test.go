package registry

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// A claim replies with the worker as the script left it, without reading
// it back (the record as stored, the durations as read): the reply must be
// what Redis then holds, for every policy, with durations in the record's
// history and a predicted end the claim moved, and so must a Pick's (before
// the claim) and a replay's of the same lease id.
func TestClaimReplyIsWhatRedisHolds(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	now := time.Now().Truncate(time.Millisecond)
	for _, spec := range Policies() {
		t.Run(string(spec.Name), func(t *testing.T) {
			pool := "reply-" + string(spec.Name)
			put(t, r, pool, selection.Worker{
				ID: "a", Status: selection.Available, Capacity: 4, Active: 1, Lifetime: 7,
				LastHeartbeat: now, PredictedEnd: now.Add(3 * time.Second),
				Durations: []time.Duration{1200 * time.Millisecond, 800 * time.Millisecond, 2 * time.Second},
			}, 0, time.Time{})
			req := ClaimRequest{Pool: pool, Policy: spec.Name, Limits: selection.Limits{MaxConcurrent: 4, MaxLifetime: 100},
				Holder: "test", LeaseID: NewLeaseID()}
			before, err := r.Worker(ctx, pool, "a")
			if err != nil {
				t.Fatal(err)
			}
			picked, _, err := r.Pick(ctx, req)
			if err != nil || !reflect.DeepEqual(picked, before) {
				t.Fatalf("Pick replied\n %+v (%v)\nRedis holds\n %+v", picked, err, before)
			}
			c, err := r.Claim(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			stored, err := r.Worker(ctx, pool, "a")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c.Worker, stored) {
				t.Fatalf("claim replied\n %+v\nRedis holds\n %+v", c.Worker, stored)
			}
			if len(c.Worker.Durations) != 3 || c.Worker.Active != 2 || c.Worker.Lifetime != 8 || !c.Worker.PredictedEnd.After(now.Add(3*time.Second)) {
				t.Fatalf("claim replied %+v: want 3 durations, active 2, lifetime 8, the predicted end moved", c.Worker)
			}
			again, err := r.Claim(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if again.LeaseID != c.LeaseID || !reflect.DeepEqual(again.Worker, stored) {
				t.Fatalf("replayed claim\n %+v\nwant\n %+v", again.Worker, stored)
			}
		})
	}
}
