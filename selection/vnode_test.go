package selection

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/zeebo/xxh3"
)

func TestXXH3StabilityRegression(t *testing.T) {
	// The vnode design pins one xxh3_128_with_seed output so that a dependency
	// upgrade that moves ring positions fails CI instead of silently
	// reshuffling every registered worker's index entries. The values were
	// computed once with zeebo/xxh3 v1.1.0 and agree with the reference
	// implementation (`printf browsergrid-worker-test-key | xxhsum -H2`
	// prints c485a8731df08f01b0ce00f57be18433 for seed 0).
	ps := Positions("browsergrid-worker-test-key", 8)
	if got, want := ps[0].String(), "c485a8731df08f01b0ce00f57be18433"; got != want {
		t.Fatalf("position 0 = %s, want %s: xxh3 output changed; ring positions of registered workers would move", got, want)
	}
	if got, want := ps[7].String(), "2d917e337ede03c2e2b4ef992a623124"; got != want {
		t.Fatalf("position 7 = %s, want %s: seeded xxh3 output changed", got, want)
	}
}

func TestPositionsBigEndian(t *testing.T) {
	// Pos must be the u128 big-endian (Hi first) so that byte order, and so
	// Redis' lexicographic order, is numeric order.
	for i, p := range Positions("worker-7", 4) {
		u := xxh3.HashString128Seed("worker-7", uint64(i))
		if p != PosFrom(u.Hi, u.Lo) {
			t.Fatalf("position %d = %s, want Hi %016x then Lo %016x", i, p, u.Hi, u.Lo)
		}
		if got, want := p.String(), fmt.Sprintf("%016x%016x", u.Hi, u.Lo); got != want {
			t.Fatalf("String() = %s, want %s", got, want)
		}
	}
	// Numeric and byte order agree across the 64-bit halves.
	a, b := PosFrom(1, ^uint64(0)), PosFrom(2, 0)
	if a.Compare(b) >= 0 || a.String() >= b.String() {
		t.Fatalf("(1, max) should sort before (2, 0)")
	}
	if len(Positions("x", 0)) != 0 || len(Positions("x", -1)) != 0 {
		t.Fatal("v <= 0 should give no positions")
	}
}

func TestRingOrderIsRedisLexOrder(t *testing.T) {
	r := NewRing()
	for i := range 200 {
		r.Add(fmt.Sprintf("chromium-%d", i), 8)
	}
	if r.Len() != 1600 || r.Workers() != 200 {
		t.Fatalf("Len %d Workers %d, want 1600 and 200", r.Len(), r.Workers())
	}
	ms := r.Members()
	if !sort.StringsAreSorted(ms) {
		t.Fatal("ring order differs from the byte order of its members (ZRANGEBYLEX order)")
	}
	es := r.Entries()
	for i := 1; i < len(es); i++ {
		if es[i-1].Pos.Compare(es[i].Pos) > 0 {
			t.Fatalf("entries %d and %d out of numeric order", i-1, i)
		}
	}
	// Same position, different workers: the ID decides, as in the member string.
	same := []RingEntry{{Pos{1}, "b"}, {Pos{1}, "a:x"}, {Pos{0}, "z"}}
	slices.SortFunc(same, RingEntry.compare)
	var members []string
	for _, e := range same {
		members = append(members, Member(e.Pos, e.ID))
	}
	if !sort.StringsAreSorted(members) {
		t.Fatalf("tie on position not ordered like members: %v", members)
	}
}

func TestRingAddRemove(t *testing.T) {
	r := NewRing()
	r.Add("a", 8)
	r.Add("b", 8)
	r.Add("a", 4) // re-registration with another V replaces
	if r.Len() != 12 {
		t.Fatalf("Len %d, want 12", r.Len())
	}
	r.Remove("a")
	r.Remove("missing")
	if r.Len() != 8 || r.Workers() != 1 {
		t.Fatalf("after Remove: Len %d Workers %d, want 8 and 1", r.Len(), r.Workers())
	}
	for _, e := range r.Entries() {
		if e.ID != "b" {
			t.Fatalf("entry of %q left behind", e.ID)
		}
	}
	want := Positions("b", 8)
	slices.SortFunc(want, Pos.Compare)
	for i, e := range r.Entries() {
		if e.Pos != want[i] {
			t.Fatalf("entry %d at %s, want %s", i, e.Pos, want[i])
		}
	}
}

func TestParseMember(t *testing.T) {
	p := Positions("w1", 1)[0]
	cases := []struct {
		in      string
		id, err string
	}{
		{Member(p, "w1"), "w1", ""},
		{Member(p, "pool:w:1"), "pool:w:1", ""},
		{strings.ToUpper(p.String()) + ":w1", "w1", ""},
		{p.String(), "", "no ':'"},
		{p.String() + ":", "", "empty worker id"},
		{"abc:w1", "", "want 32 hex digits"},
		{strings.Repeat("g", 32) + ":w1", "", "invalid byte"},
		{"", "", "no ':'"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			gp, id, err := ParseMember(c.in)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil || id != c.id || gp != p {
				t.Fatalf("got (%s, %q, %v), want (%s, %q)", gp, id, err, p, c.id)
			}
		})
	}
}

// recRand records the calls a draw makes, answering from a seeded source.
type recRand struct {
	r     *rand.Rand
	calls []string
}

func (r *recRand) Uint64() uint64 { r.calls = append(r.calls, "U"); return r.r.Uint64() }
func (r *recRand) IntN(n int) int {
	r.calls = append(r.calls, fmt.Sprintf("I%d", n))
	return r.r.IntN(n)
}

func TestDrawOrder(t *testing.T) {
	cases := []struct {
		v    Vnode
		want string
	}{
		{Vnode{Samples: 3, SlotJitter: 4}, "U U U U U U I4 I4 I4 U"},
		{Vnode{Samples: 2, SlotJitter: 0}, "U U U U U"},
		{Vnode{Samples: 1, SlotJitter: 7}, "U U I7 U"},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("K=%d jitter=%d", c.v.Samples, c.v.SlotJitter), func(t *testing.T) {
			rr := &recRand{r: rand.New(rand.NewPCG(9, 9))}
			d := c.v.Draw(rr)
			if got := strings.Join(rr.calls, " "); got != c.want {
				t.Fatalf("calls %q, want %q", got, c.want)
			}
			// Replaying the same source gives the values in that order.
			r := rand.New(rand.NewPCG(9, 9))
			for i := range c.v.Samples {
				hi, lo := r.Uint64(), r.Uint64()
				if d.Pivots[i] != PosFrom(hi, lo) {
					t.Fatalf("pivot %d = %s, want (%x, %x)", i, d.Pivots[i], hi, lo)
				}
			}
			for i := range c.v.Samples {
				want := 0
				if c.v.SlotJitter > 0 {
					want = r.IntN(c.v.SlotJitter)
				}
				if d.Jitter[i] != want {
					t.Fatalf("jitter %d = %d, want %d", i, d.Jitter[i], want)
				}
			}
			if tb := r.Uint64(); d.Tiebreak != tb {
				t.Fatalf("tiebreak %d, want %d", d.Tiebreak, tb)
			}
		})
	}
}

func TestVnodeDefaultsAndValidate(t *testing.T) {
	var v Vnode
	v.SetDefaults()
	if v.VirtualNodes != 8 || v.Samples != 2 || v.MaxScan != 16 || v.SlotJitter != 4 {
		t.Fatalf("defaults %+v, want V 8, K 2, max_scan 16, slot_jitter 4", v)
	}
	if err := v.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	off := Vnode{SlotJitter: -1}
	off.SetDefaults()
	if off.SlotJitter != 0 {
		t.Fatalf("slot_jitter -1 should mean off, got %d", off.SlotJitter)
	}
	cases := []struct {
		name string
		edit func(*Vnode)
		err  string
	}{
		{"V 1 ok", func(v *Vnode) { v.VirtualNodes = 1 }, ""},
		{"V 64 ok", func(v *Vnode) { v.VirtualNodes = 64 }, ""},
		{"V 0", func(v *Vnode) { v.VirtualNodes = 0 }, "virtual_nodes 0"},
		{"V 65", func(v *Vnode) { v.VirtualNodes = 65 }, "virtual_nodes 65"},
		{"K 1 ok", func(v *Vnode) { v.Samples = 1 }, ""},
		{"K 8 ok", func(v *Vnode) { v.Samples = 8 }, ""},
		{"K 9", func(v *Vnode) { v.Samples = 9 }, "samples 9"},
		{"K -1", func(v *Vnode) { v.Samples = -1 }, "samples -1"},
		{"max_scan 256 ok", func(v *Vnode) { v.MaxScan = 256 }, ""},
		{"max_scan 257", func(v *Vnode) { v.MaxScan = 257 }, "max_scan 257"},
		{"max_scan 0", func(v *Vnode) { v.MaxScan = 0 }, "max_scan 0"},
		{"slot_jitter 0 ok", func(v *Vnode) { v.SlotJitter = 0 }, ""},
		{"slot_jitter 64 ok", func(v *Vnode) { v.SlotJitter = 64 }, ""},
		{"slot_jitter 65", func(v *Vnode) { v.SlotJitter = 65 }, "slot_jitter 65"},
		{"slot_jitter -1", func(v *Vnode) { v.SlotJitter = -1 }, "slot_jitter -1"},
		{"negative max_lifetime", func(v *Vnode) { v.MaxLifetime = -1 }, "max_lifetime -1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := Vnode{}
			v.SetDefaults()
			c.edit(&v)
			err := v.Validate()
			if c.err == "" && err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
				t.Fatalf("error %v, want one naming %q", err, c.err)
			}
		})
	}
}

// vring is a ring of workers A.. with one position each, its entries in
// ring order, and a lookup over ws.
func vring(ws []Worker) (*Ring, []RingEntry, func(string) (*Worker, bool)) {
	r := NewRing()
	for i := range ws {
		r.Add(ws[i].ID, 1)
	}
	byID := map[string]*Worker{}
	for i := range ws {
		byID[ws[i].ID] = &ws[i]
	}
	return r, r.Entries(), func(id string) (*Worker, bool) { w, ok := byID[id]; return w, ok }
}

func next(p Pos) Pos {
	for i := len(p) - 1; i >= 0; i-- {
		p[i]++
		if p[i] != 0 {
			break
		}
	}
	return p
}

func TestVnodeSelect(t *testing.T) {
	stale := t0.Add(-time.Hour)
	type want struct {
		id                                 string // at ring entry; "" none
		stale                              []int  // ring entries
		scanned, wraps, effective, dedupes int
		tied                               bool
	}
	cases := []struct {
		name   string
		v      Vnode
		active []int // per ring entry
		edit   func(ws []Worker, e []RingEntry, by func(int) *Worker)
		pivots []int // ring entry each pivot lands on exactly; -1: past the last entry
		jitter []int
		tb     uint64
		want   want
		wantAt int // ring entry chosen; -1 none
	}{
		{
			name: "K=1 takes the successor without comparing slots",
			v:    Vnode{Samples: 1}, active: []int{9, 0, 0, 0}, pivots: []int{0},
			wantAt: 0, want: want{scanned: 1, effective: 1},
		},
		{
			name: "K=1 past the last entry wraps to the first",
			v:    Vnode{Samples: 1}, active: []int{0, 0, 0, 0}, pivots: []int{-1},
			wantAt: 0, want: want{scanned: 1, wraps: 1, effective: 1},
		},
		{
			name: "K=2 takes the fewer slots",
			v:    Vnode{Samples: 2}, active: []int{5, 1, 0, 0}, pivots: []int{0, 1},
			wantAt: 1, want: want{scanned: 2, effective: 2},
		},
		{
			name: "K=3 minimum with descending loads",
			v:    Vnode{Samples: 3}, active: []int{3, 2, 1, 9}, pivots: []int{0, 1, 2},
			wantAt: 2, want: want{scanned: 3, effective: 3},
		},
		{
			name: "K=3 minimum with shuffled loads",
			v:    Vnode{Samples: 3}, active: []int{2, 1, 3, 9}, pivots: []int{2, 0, 1},
			wantAt: 1, want: want{scanned: 3, effective: 3},
		},
		{
			name: "K=3 minimum first among candidates",
			v:    Vnode{Samples: 3}, active: []int{1, 2, 3, 9}, pivots: []int{0, 1, 2},
			wantAt: 0, want: want{scanned: 3, effective: 3},
		},
		{
			name: "jitter is added before comparing",
			v:    Vnode{Samples: 2}, active: []int{1, 3, 0, 0}, pivots: []int{0, 1}, jitter: []int{3, 0},
			wantAt: 1, want: want{scanned: 2, effective: 2},
		},
		{
			name: "tie: tiebreak 0 picks the first tied candidate",
			v:    Vnode{Samples: 3}, active: []int{2, 2, 5, 0}, pivots: []int{2, 1, 0}, tb: 0,
			wantAt: 1, want: want{scanned: 3, effective: 3, tied: true},
		},
		{
			name: "tie: tiebreak 3 picks tied[3 % 2], the second",
			v:    Vnode{Samples: 3}, active: []int{2, 2, 5, 0}, pivots: []int{2, 1, 0}, tb: 3,
			wantAt: 0, want: want{scanned: 3, effective: 3, tied: true},
		},
		{
			name: "K=1 never reports a tie",
			v:    Vnode{Samples: 1}, active: []int{0, 0, 0, 0}, pivots: []int{3}, tb: 1,
			wantAt: 3, want: want{scanned: 1, effective: 1},
		},
		{
			name: "two samples on one worker: a dedupe, one candidate",
			v:    Vnode{Samples: 2}, active: []int{4, 0, 0, 0}, pivots: []int{0, 0},
			wantAt: 0, want: want{scanned: 2, effective: 1, dedupes: 1},
		},
		{
			name: "stale entry walked past, reported once, charged",
			v:    Vnode{Samples: 1, Limits: Limits{StaleAfter: time.Second}}, active: []int{0, 0, 0, 0}, pivots: []int{0},
			edit:   func(ws []Worker, e []RingEntry, by func(int) *Worker) { by(0).LastHeartbeat = stale },
			wantAt: 1, want: want{stale: []int{0}, scanned: 2, effective: 1},
		},
		{
			name: "missing record is reported stale",
			v:    Vnode{Samples: 1}, active: []int{0, 0, 0, 0}, pivots: []int{1},
			edit:   func(ws []Worker, e []RingEntry, by func(int) *Worker) { by(1).ID = "gone" },
			wantAt: 2, want: want{stale: []int{1}, scanned: 2, effective: 1},
		},
		{
			name: "draining and full workers are walked past, not reported",
			v:    Vnode{Samples: 1, Limits: Limits{MaxConcurrent: 2}}, active: []int{0, 2, 0, 0}, pivots: []int{0},
			edit:   func(ws []Worker, e []RingEntry, by func(int) *Worker) { by(0).Status = Draining },
			wantAt: 2, want: want{scanned: 3, effective: 1},
		},
		{
			name: "K=1 budget runs out: none",
			v:    Vnode{Samples: 1, Limits: Limits{MaxScan: 2, StaleAfter: time.Second}}, active: []int{0, 0, 0, 0}, pivots: []int{2},
			edit: func(ws []Worker, e []RingEntry, by func(int) *Worker) {
				by(2).LastHeartbeat = stale
				by(3).SuspectUntil = t0.Add(time.Second)
			},
			wantAt: -1, want: want{stale: []int{2}, scanned: 2},
		},
		{
			name: "budget is spent in the wrap walk too",
			v:    Vnode{Samples: 1, Limits: Limits{MaxScan: 2, StaleAfter: time.Second}}, active: []int{0, 0, 0, 0}, pivots: []int{3},
			edit: func(ws []Worker, e []RingEntry, by func(int) *Worker) {
				by(3).LastHeartbeat = stale
				by(0).LastHeartbeat = stale
			},
			wantAt: -1, want: want{stale: []int{3, 0}, scanned: 2, wraps: 1},
		},
		{
			name: "K=2 budget runs out in the second sample: the first candidate wins",
			v:    Vnode{Samples: 2, Limits: Limits{MaxScan: 2}}, active: []int{7, 0, 0, 0}, pivots: []int{0, 1},
			edit: func(ws []Worker, e []RingEntry, by func(int) *Worker) {
				by(1).Status = Draining
				by(2).Status = Draining
			},
			wantAt: 0, want: want{scanned: 3, effective: 1},
		},
		{
			name: "an unusable entry costs budget each time it is walked",
			v:    Vnode{Samples: 3, Limits: Limits{MaxScan: 2}}, active: []int{0, 0, 0, 0}, pivots: []int{1, 1, 1},
			edit:   func(ws []Worker, e []RingEntry, by func(int) *Worker) { by(1).SuspectUntil = t0.Add(time.Second) },
			wantAt: 2, want: want{scanned: 3, effective: 1},
		},
		{
			name: "nothing eligible, unbounded: every sample walks the whole ring",
			v:    Vnode{Samples: 2}, active: []int{0, 0, 0, 0}, pivots: []int{1, 3},
			edit: func(ws []Worker, e []RingEntry, by func(int) *Worker) {
				for i := range ws {
					ws[i].Status = Draining
				}
			},
			wantAt: -1, want: want{scanned: 8, wraps: 2},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ws := fleet(0, 0, 0, 0)
			_, entries, _ := vring(ws)
			by := func(e int) *Worker {
				for i := range ws {
					if ws[i].ID == entries[e].ID {
						return &ws[i]
					}
				}
				panic("no worker")
			}
			for e, a := range c.active {
				by(e).Active = a
			}
			ids := make([]string, len(entries))
			for e := range entries {
				ids[e] = entries[e].ID
			}
			if c.edit != nil {
				c.edit(ws, entries, by)
			}
			// Rebuild the lookup after edits (an edited ID makes a record missing).
			byID := map[string]*Worker{}
			for i := range ws {
				byID[ws[i].ID] = &ws[i]
			}
			ring := NewRing()
			for _, id := range ids {
				ring.Add(id, 1)
			}
			lookup := func(id string) (*Worker, bool) { w, ok := byID[id]; return w, ok }
			draw := VnodeDraw{Tiebreak: c.tb, Jitter: c.jitter}
			for _, p := range c.pivots {
				if p < 0 {
					draw.Pivots = append(draw.Pivots, next(entries[len(entries)-1].Pos))
				} else {
					draw.Pivots = append(draw.Pivots, entries[p].Pos)
				}
			}
			d := c.v.Select(ring, lookup, draw, t0)
			wantID := ""
			if c.wantAt >= 0 {
				wantID = ids[c.wantAt]
			}
			var wantStale []string
			for _, e := range c.want.stale {
				wantStale = append(wantStale, ids[e])
			}
			got := fmt.Sprintf("id=%q ok=%v stale=%v scanned=%d wraps=%d effective=%d dedupes=%d tied=%v index=%d",
				d.ID, d.OK, d.Stale, d.Scanned, d.Wraps, d.Effective, d.Dedupes, d.TiedMin, d.Index)
			exp := fmt.Sprintf("id=%q ok=%v stale=%v scanned=%d wraps=%d effective=%d dedupes=%d tied=%v index=%d",
				wantID, wantID != "", wantStale, c.want.scanned, c.want.wraps, c.want.effective, c.want.dedupes, c.want.tied, -1)
			if got != exp {
				t.Fatalf("\n got %s\nwant %s", got, exp)
			}
		})
	}
}

func TestVnodeSelectOddInputs(t *testing.T) {
	v := Vnode{Samples: 2}
	lookup := func(string) (*Worker, bool) { return nil, false }
	if d := v.Select(nil, lookup, VnodeDraw{}, t0); d.OK || d.Index != -1 {
		t.Fatalf("nil ring: %+v", d)
	}
	d := v.Select(NewRing(), lookup, VnodeDraw{}, t0)
	if d.OK || d.Wraps != 2 || d.Scanned != 0 {
		t.Fatalf("empty ring: %+v, want none with 2 wraps", d)
	}
	// A draw shorter than K reads as zeros: no panic.
	ws := fleet(0, 0)
	ring, _, lk := vring(ws)
	if d := (Vnode{Samples: 3, SlotJitter: 4}).Select(ring, lk, VnodeDraw{Pivots: []Pos{{}}}, t0); !d.OK {
		t.Fatalf("short draw: %+v", d)
	}
}
