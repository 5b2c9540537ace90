package workeragent

import (
	"strings"
	"testing"
	"time"
)

// The stop's deadlines keep the monotonic reading of the signal's time:
// a step of the wall clock during a stop moves none of them (a red team
// of 84cf022: stored as Unix nanoseconds, a +1 h step would have ended
// the drain at once and left nothing to deregister or close the browser).
func TestStopDeadlinesAreMonotonic(t *testing.T) {
	a := &Agent{cfg: Config{DrainTimeout: 30 * time.Second}}
	now := time.Now()
	a.signalled.Store(&now)
	for name, d := range map[string]time.Time{"drainEnd": a.drainEnd(now.Add(time.Millisecond)), "recordsEnd": a.recordsEnd()} {
		if !strings.Contains(d.String(), "m=") {
			t.Errorf("%s %s has no monotonic reading", name, d)
		}
	}
	if g := a.browserGrace(); g != stopGrace {
		t.Errorf("browser grace %s right after the signal, want %s", g, stopGrace)
	}
}
