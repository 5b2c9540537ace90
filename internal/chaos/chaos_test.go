package chaos

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The figures' arithmetic, on scripted samples and outcomes (the
// scenarios themselves run in cmd/gridchaos: make chaos).

var t0 = time.Date(2026, 11, 23, 6, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func TestHealTime(t *testing.T) {
	served := func(startMS int) *outcome {
		return &outcome{start: at(startMS), opened: at(startMS + 10), end: at(startMS + 300)}
	}
	failed := func(startMS, endMS int) *outcome {
		return &outcome{start: at(startMS), end: at(endMS), err: errors.New("503")}
	}
	samples := func(bad ...int) []sample {
		var s []sample
		for ms := 0; ms <= 10000; ms += 100 {
			isBad := false
			for _, b := range bad {
				isBad = isBad || b == ms
			}
			s = append(s, sample{at: at(ms), bad: isBad})
		}
		return s
	}
	tests := []struct {
		name    string
		outs    []*outcome
		samples []sample
		want    time.Duration
		healed  bool
	}{
		{"nothing wrong: the first session served", []*outcome{served(1000), served(2500)}, samples(), 10 * time.Millisecond, true},
		{"counts wrong until 3.0 s", []*outcome{served(1000), served(2500)}, samples(2000, 2900), 2000 * time.Millisecond, true},
		{"bad before the fault does not count", []*outcome{served(1200)}, samples(500), 210 * time.Millisecond, true},
		{"an error at 4 s: the next session served after it", []*outcome{served(1200), failed(3000, 4000), served(4200)}, samples(), 3210 * time.Millisecond, true},
		{"still bad at the last sample", []*outcome{served(1200)}, samples(10000), 0, false},
		{"nothing served after the last error", []*outcome{served(1200), failed(3000, 4000)}, samples(), 0, false},
		{"an excused error is no error", []*outcome{served(1200), {start: at(3000), end: at(4000), err: errors.New("x"), excused: true}}, samples(), 210 * time.Millisecond, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, healed := healTime(tt.outs, tt.samples, at(1000))
			if healed != tt.healed || got != tt.want {
				t.Errorf("healTime = %s, %v; want %s, %v", got, healed, tt.want, tt.healed)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	r := &run{
		outages:        [][2]time.Time{{at(1000), at(2000)}},
		swaps:          [][2]time.Time{{at(10000), at(11000)}},
		killedFrontend: map[int]time.Time{1: at(5000)},
		workerKills:    []workerKill{{at: at(8000), live: 2}},
		slowRefusal:    3 * time.Second,
	}
	broke := func(fe, opened, end int) *outcome {
		return &outcome{frontend: fe, start: at(opened - 10), opened: at(opened), end: at(end), err: errors.New("broke"), broke: true}
	}
	cut := func(start, end int) *outcome {
		return &outcome{start: at(start), end: at(end), err: errors.New("EOF"), cut: true}
	}
	refused := func(fe, start, end int) *outcome {
		return &outcome{frontend: fe, start: at(start), end: at(end), err: errors.New("503"), status: 503}
	}
	tests := []struct {
		name string
		o    *outcome
		want bool
	}{
		{"refused during the outage", refused(0, 1500, 1600), true},
		{"refused, overlapping the outage's start", refused(0, 900, 1100), true},
		{"refused after the outage", refused(0, 2100, 2200), false},
		{"refused during the outage, but too slowly", refused(0, 1000, 4500), false},
		{"a session that broke during the outage", broke(0, 500, 1500), false},
		{"broke on the killed frontend", broke(1, 4000, 5000), true},
		{"refused on the killed frontend right after the kill", refused(1, 5100, 5200), true},
		{"broke on the other frontend at the kill", broke(0, 4000, 5000), false},
		{"broke when the worker was killed", broke(0, 7000, 8100), true},
		{"opened after the worker was killed", broke(0, 8050, 8100), false},
		{"begun before the kill, its 101 read just after", &outcome{start: at(7990), opened: at(8005), end: at(8100), err: errors.New("broke"), broke: true}, true},
		{"a handshake cut during a reload's listener swap", cut(10500, 10510), true},
		{"a handshake cut overlapping the swap's end", cut(10990, 11010), true},
		{"a handshake cut after the swap", cut(11100, 11110), false},
		{"a handshake cut before the swap", cut(9900, 9990), false},
		{"a handshake begun before the swap, cut in it", cut(9990, 10010), true},
		{"refused during the swap", refused(0, 10500, 10510), false},
		{"a session that broke during the swap", broke(0, 9000, 10500), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r.classify([]*outcome{tt.o})
			if tt.o.excused != tt.want {
				t.Errorf("excused = %v, want %v", tt.o.excused, tt.want)
			}
		})
	}
	t.Run("a worker kill excuses only its live sessions", func(t *testing.T) {
		outs := []*outcome{broke(0, 7000, 8100), broke(0, 7100, 8200), broke(0, 7200, 8300)}
		r.classify(outs)
		n := 0
		for _, o := range outs {
			if o.excused {
				n++
			}
		}
		if n != 2 {
			t.Errorf("%d excused, want 2 (the worker held 2)", n)
		}
	})
}

func TestCheck(t *testing.T) {
	ok := Result{Served: 10, Healed: true, Heal: 2 * time.Second, HealBound: 6 * time.Second}
	if f := check(ok, 0); len(f) != 0 {
		t.Fatalf("a clean row failed: %v", f)
	}
	tests := []struct {
		name   string
		change func(*Result)
		want   string
	}{
		{"an error", func(r *Result) { r.Errors = 1 }, "1 client-visible errors"},
		{"a leak", func(r *Result) { r.Leaked = 2 }, "2 slots leaked"},
		{"Redis unreadable at the end", func(r *Result) { r.Leaked = -1 }, "-1 slots leaked"},
		{"an over-admission", func(r *Result) { r.OverAdmissions = 1 }, "1 over-admissions"},
		{"an overshoot", func(r *Result) { r.Overshoots = 3 }, "3 lifetime overshoots"},
		{"healed too late", func(r *Result) { r.Heal = 7 * time.Second }, "healed in 7s"},
		{"never healed", func(r *Result) { r.Healed = false }, "not healed"},
		{"nothing served", func(r *Result) { r.Served = 0 }, "nothing served"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ok
			tt.change(&r)
			f := check(r, 0)
			if len(f) != 1 || !strings.Contains(f[0], tt.want) {
				t.Errorf("failures %q, want one containing %q", f, tt.want)
			}
		})
	}
	if f := check(ok, 1); len(f) != 1 || !strings.Contains(f[0], "lifetime counts with no session") {
		t.Errorf("a phantom lifetime count: failures %q", f)
	}
	// Within the measurement's slack.
	r := ok
	r.Heal = r.HealBound + healSlack
	if f := check(r, 0); len(f) != 0 {
		t.Errorf("heal at the bound plus slack failed: %v", f)
	}
}

func TestP99(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	if got := p99(d); got != 99*time.Millisecond {
		t.Errorf("p99 of 1..100 ms = %s, want 99ms", got)
	}
	if got := p99(nil); got != 0 {
		t.Errorf("p99 of nothing = %s", got)
	}
}

// A frontend out of rotation is never picked, however many clients pick
// at once. Each pick used to draw the shared counter once per frontend it
// looked at, so with another client drawing in between it could look at
// the down one twice and fall back to it (caddy-kill then counted a dial
// of the killed instance, long after it left the rotation, as an error).
func TestPickSkipsDownFrontendUnderConcurrency(t *testing.T) {
	tr := newTraffic([]string{"ws://a", "ws://b"}, time.Second)
	tr.down[0].Store(true)
	var wrong atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20000 {
				if tr.pick() == 0 {
					wrong.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := wrong.Load(); n > 0 {
		t.Fatalf("the down frontend was picked %d times in 160,000 picks", n)
	}
}

// -only names a scenario exactly when one has that name: redis-restart
// ran redis-restart-spent and redis-restart-moved too, which the docs'
// example for running one scenario did not say.
func TestOnlyPrefersAnExactName(t *testing.T) {
	all := []Scenario{{Name: "redis-restart"}, {Name: "redis-restart-spent"}, {Name: "redis-stall"}, {Name: "caddy-kill"}}
	names := func(ss []Scenario) string {
		var n []string
		for _, s := range ss {
			n = append(n, s.Name)
		}
		return strings.Join(n, ",")
	}
	for only, want := range map[string]string{
		"":                   "redis-restart,redis-restart-spent,redis-stall,caddy-kill",
		"redis-restart":      "redis-restart",
		"redis":              "redis-restart,redis-restart-spent,redis-stall",
		"spent, caddy-kill":  "redis-restart-spent,caddy-kill",
		"redis-restart,kill": "redis-restart,caddy-kill",
		"no-such":            "",
	} {
		if got := names(selectScenarios(all, only)); got != want {
			t.Errorf("-only %q: %q, want %q", only, got, want)
		}
	}
}
