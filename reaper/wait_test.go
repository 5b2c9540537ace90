package reaper

import (
	"testing"
	"time"
)

// An operator's interval is the longest gap between two regular passes: a
// stale record waits at most one interval (plus the pass) to go. The waits
// still spread over the interval's last tenth, so the reapers of many
// instances drift apart.
func TestRegularPassesAreNeverMoreThanAnIntervalApart(t *testing.T) {
	const interval = time.Minute
	lo, hi := interval, time.Duration(0)
	for range 10000 {
		w := nextWait(interval)
		if w > interval || w < interval*9/10 {
			t.Fatalf("wait %s: want between %s and %s", w, interval*9/10, interval)
		}
		lo, hi = min(lo, w), max(hi, w)
	}
	if hi-lo < interval/20 {
		t.Fatalf("waits spread over %s only (%s to %s): reapers would not drift apart", hi-lo, lo, hi)
	}
}
