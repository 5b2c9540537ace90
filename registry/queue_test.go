package registry

import (
	"context"
	"errors"
	"testing"
	"time"
)

// queued joins w to pool's queue and fails the test unless it is queued.
func queued(t *testing.T, r *Registry, pool, id string) Waiter {
	t.Helper()
	w := Waiter{ID: id, Versions: []string{""}}
	if _, ok, err := r.QueueJoin(context.Background(), pool, w, 0); err != nil || !ok {
		t.Fatalf("%s joins the queue: ok %v, %v", id, ok, err)
	}
	return w
}

// TestTheOldestWaiterIsServedFirstAcrossInstances: a slot freed goes to
// the request that has waited longest in the pool, whichever instance
// holds it and whichever claims first; a request not queued yet waits
// behind both.
func TestTheOldestWaiterIsServedFirstAcrossInstances(t *testing.T) {
	ctx := context.Background()
	r, _ := newTestRegistry(t)
	register(t, r, "p", "w1", 1)
	held := claim(t, r, ClaimRequest{Group: "p"})
	queued(t, r, "p", "a") // instance 1's
	queued(t, r, "p", "b") // instance 2's
	if _, err := r.GiveBack(ctx, "p", "w1", false, 0, held.Session); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tryClaim(r, ClaimRequest{Group: "p"}); !errors.Is(err, ErrBehind) {
		t.Fatalf("a request not queued: %v, want ErrBehind", err)
	}
	if _, _, err := tryClaim(r, ClaimRequest{Group: "p", Waiter: "b"}); !errors.Is(err, ErrBehind) {
		t.Fatalf("the younger waiter: %v, want ErrBehind", err)
	}
	c := claim(t, r, ClaimRequest{Group: "p", Waiter: "a"})
	st, err := r.QueueKeep(ctx, "p", []Waiter{{ID: "a"}, {ID: "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if st.Depth != 1 || st.Positions[0] != -1 || st.Positions[1] != 0 || st.Served != 1 {
		t.Fatalf("after a's claim: %+v, want b alone, first, and one served", st)
	}
	if _, err := r.GiveBack(ctx, "p", "w1", false, 0, c.Session); err != nil {
		t.Fatal(err)
	}
	claim(t, r, ClaimRequest{Group: "p", Waiter: "b"})
}

// TestAGrantNotTakenUpPassesOn: an older waiter whose instance does not
// claim the worker it was granted within QueueGrant no longer holds
// others back, and a waiter its instance stopped keeping leaves the queue
// within QueueKeepFor.
func TestAGrantNotTakenUpPassesOn(t *testing.T) {
	ctx := context.Background()
	t.Run("slow", func(t *testing.T) {
		r, _ := newTestRegistry(t)
		register(t, r, "p", "w1", 1)
		queued(t, r, "p", "a")
		queued(t, r, "p", "b")
		if _, _, err := tryClaim(r, ClaimRequest{Group: "p", Waiter: "b"}); !errors.Is(err, ErrBehind) {
			t.Fatalf("b while a holds its grant: %v, want ErrBehind", err)
		}
		time.Sleep(QueueGrant + 50*time.Millisecond)
		if _, err := r.QueueKeep(ctx, "p", []Waiter{{ID: "a", Versions: []string{""}}}); err != nil {
			t.Fatal(err)
		}
		claim(t, r, ClaimRequest{Group: "p", Waiter: "b"})
	})
	t.Run("gone", func(t *testing.T) {
		r, _ := newTestRegistry(t)
		register(t, r, "p", "w1", 1)
		queued(t, r, "p", "a")
		time.Sleep(QueueKeepFor + 50*time.Millisecond)
		claim(t, r, ClaimRequest{Group: "p"})
	})
}

// TestAWaiterYieldsOnlyToThoseWhoCouldTakeTheWorker: an older waiter for
// another Playwright version, or one that avoids the worker found, does
// not hold a request back.
func TestAWaiterYieldsOnlyToThoseWhoCouldTakeTheWorker(t *testing.T) {
	ctx := context.Background()
	r, _ := newTestRegistry(t)
	register(t, r, "p@1.65", "w1", 1)
	if _, _, err := r.QueueJoin(ctx, "p", Waiter{ID: "a", Versions: []string{"1.64"}}, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.QueueJoin(ctx, "p", Waiter{ID: "b", Versions: []string{"1.65"}, Avoid: []string{"w1"}}, 0); err != nil {
		t.Fatal(err)
	}
	claim(t, r, ClaimRequest{Group: "p@1.65"})
}

// TestTheQueueBoundIsPoolWide: limit counts every instance's waiters.
func TestTheQueueBoundIsPoolWide(t *testing.T) {
	ctx := context.Background()
	r, _ := newTestRegistry(t)
	for _, id := range []string{"a", "b"} {
		if _, ok, err := r.QueueJoin(ctx, "p", Waiter{ID: id}, 2); err != nil || !ok {
			t.Fatalf("%s: %v %v", id, ok, err)
		}
	}
	if pos, ok, err := r.QueueJoin(ctx, "p", Waiter{ID: "c"}, 2); err != nil || ok || pos != 2 {
		t.Fatalf("a third waiter under a bound of 2: queued %v, %d, %v", ok, pos, err)
	}
	if err := r.QueueLeave(ctx, "p", "a"); err != nil {
		t.Fatal(err)
	}
	if pos, ok, err := r.QueueJoin(ctx, "p", Waiter{ID: "c"}, 2); err != nil || !ok || pos != 1 {
		t.Fatalf("after one left: queued %v at %d, %v", ok, pos, err)
	}
}

// TestAnInstanceQueueingOnItsOwnIgnoresThePoolsQueue: an instance with
// shared_queue off claims as if the pool's queue were empty, since its
// own waiters never join it.
func TestAnInstanceQueueingOnItsOwnIgnoresThePoolsQueue(t *testing.T) {
	r, _ := newTestRegistry(t)
	register(t, r, "p", "w1", 1)
	queued(t, r, "p", "a")
	if _, _, err := tryClaim(r, ClaimRequest{Group: "p"}); !errors.Is(err, ErrBehind) {
		t.Fatalf("a request of the shared queue: %v, want ErrBehind", err)
	}
	claim(t, r, ClaimRequest{Group: "p", Waiter: OwnQueue})
}
