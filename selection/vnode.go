package selection

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/zeebo/xxh3"
)

// Defaults and valid ranges of the vnode policy (the vnode design's configuration
// table: virtual_nodes 8 with 4-32 recommended, samples 2, max_scan 16 in
// 1-256, slot_jitter 4 in 0-64). V is accepted from 1 to 64 so the
// imbalance table's extremes can be configured; K above 8 buys nothing
// (the vnode design calls 3 the knee).
const (
	DefaultVirtualNodes = 8
	DefaultSamples      = 2
	DefaultVnodeMaxScan = 16
	DefaultSlotJitter   = 4

	MaxVirtualNodes = 64
	MaxSamples      = 8
	MaxVnodeMaxScan = 256
	MaxSlotJitter   = 64
)

// Pos is a position on the ring: an unsigned 128-bit integer stored
// big-endian, so that comparing the bytes (as Redis does for the members of
// a lexicographic sorted set) is comparing the numbers.
type Pos [16]byte

// String is the position as 32 lowercase hexadecimal digits: the prefix of
// the worker's members in the registry's ring.
func (p Pos) String() string { return hex.EncodeToString(p[:]) }

// Compare orders positions numerically: -1, 0 or +1.
func (p Pos) Compare(q Pos) int { return bytes.Compare(p[:], q[:]) }

// PosFrom builds the position whose high 64 bits are hi and low 64 bits lo.
func PosFrom(hi, lo uint64) Pos {
	var p Pos
	binary.BigEndian.PutUint64(p[:8], hi)
	binary.BigEndian.PutUint64(p[8:], lo)
	return p
}

// ParsePos reads what Pos.String writes: exactly 32 hexadecimal digits
// (either case).
func ParsePos(s string) (Pos, error) {
	var p Pos
	if len(s) != 2*len(p) {
		return p, fmt.Errorf("ring position %q: want %d hex digits, have %d", s, 2*len(p), len(s))
	}
	if _, err := hex.Decode(p[:], []byte(s)); err != nil {
		return Pos{}, fmt.Errorf("ring position %q: %w", s, err)
	}
	return p, nil
}

// Member is the registry's ring member for one position of a worker:
// "<Pos.String()>:<workerID>". In a sorted set whose scores are all equal
// Redis orders members by their bytes, which is ring order (position, then
// worker ID), because every position has the same length.
func Member(p Pos, workerID string) string { return p.String() + ":" + workerID }

// ParseMember splits a ring member written by Member. The worker ID may
// itself contain ':' but must not be empty.
func ParseMember(m string) (Pos, string, error) {
	hexPart, id, ok := strings.Cut(m, ":")
	if !ok {
		return Pos{}, "", fmt.Errorf("ring member %q: no ':' after the position", m)
	}
	p, err := ParsePos(hexPart)
	if err != nil {
		return Pos{}, "", fmt.Errorf("ring member %q: %w", m, err)
	}
	if id == "" {
		return Pos{}, "", fmt.Errorf("ring member %q: empty worker id", m)
	}
	return p, id, nil
}

// Positions are a worker's v ring positions: for i in 0..v-1, the 128-bit
// xxh3 hash of the worker ID seeded with i, high half first, big-endian
// (the vnode design: xxh3_128_with_seed(key, i).to_be_bytes()). They depend only on
// the ID, so anyone can recompute them to delete exactly what registration
// wrote. v <= 0 gives none.
func Positions(workerID string, v int) []Pos {
	if v <= 0 {
		return nil
	}
	ps := make([]Pos, v)
	for i := range ps {
		// Uint128.Bytes is canonical big-endian, Hi then Lo (checked by
		// TestPositionsBigEndian).
		ps[i] = xxh3.HashString128Seed(workerID, uint64(i)).Bytes()
	}
	return ps
}

// RingEntry is one position of one worker on the ring.
type RingEntry struct {
	Pos Pos
	ID  string
}

func (e RingEntry) compare(f RingEntry) int {
	if c := e.Pos.Compare(f.Pos); c != 0 {
		return c
	}
	return strings.Compare(e.ID, f.ID)
}

// Ring is the set of every registered worker's positions, kept in ring
// order (position, then worker ID) like the registry's sorted set. Like a
// map, it may be read (Select, Entries, Members, Len) from many goroutines
// at once, but Add and Remove need exclusive access.
type Ring struct {
	entries []RingEntry
	v       map[string]int
	// mu guards the lazy sort that the first read after Add performs.
	mu     sync.Mutex
	sorted bool
}

// NewRing returns an empty ring.
func NewRing() *Ring { return &Ring{v: map[string]int{}, sorted: true} }

// Add puts the worker's v positions on the ring, replacing any it had
// (re-registration with another v). Adding many workers costs one sort,
// done lazily by the next read.
func (r *Ring) Add(id string, v int) {
	if _, ok := r.v[id]; ok {
		r.Remove(id)
	}
	if v <= 0 {
		return
	}
	r.v[id] = v
	for _, p := range Positions(id, v) {
		r.entries = append(r.entries, RingEntry{Pos: p, ID: id})
	}
	r.sorted = false
}

// Remove takes every position of the worker off the ring.
func (r *Ring) Remove(id string) {
	if _, ok := r.v[id]; !ok {
		return
	}
	delete(r.v, id)
	r.entries = slices.DeleteFunc(r.entries, func(e RingEntry) bool { return e.ID == id })
}

// Len is the number of entries (positions) on the ring.
func (r *Ring) Len() int { return len(r.entries) }

// Workers is the number of workers on the ring.
func (r *Ring) Workers() int { return len(r.v) }

// Entries returns the ring's entries in ring order (a copy).
func (r *Ring) Entries() []RingEntry {
	r.sort()
	return slices.Clone(r.entries)
}

// Members returns the ring as the registry stores it: Member strings in
// ring order.
func (r *Ring) Members() []string {
	r.sort()
	out := make([]string, len(r.entries))
	for i, e := range r.entries {
		out[i] = Member(e.Pos, e.ID)
	}
	return out
}

func (r *Ring) sort() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.sorted {
		slices.SortFunc(r.entries, RingEntry.compare)
		r.sorted = true
	}
}

// search is the index of the first entry with a position >= p.
func (r *Ring) search(p Pos) int {
	i, _ := slices.BinarySearchFunc(r.entries, p, func(e RingEntry, p Pos) int { return e.Pos.Compare(p) })
	return i
}

// SetDefaults fills zero fields with the defaults: V 8, K 2, max_scan 16,
// slot_jitter 4. A SlotJitter of 0 cannot be told from "unset", so a
// configuration that wants no jitter says -1, which SetDefaults turns into
// 0 (or it sets 0 after SetDefaults).
func (v *Vnode) SetDefaults() {
	if v.VirtualNodes == 0 {
		v.VirtualNodes = DefaultVirtualNodes
	}
	if v.Samples == 0 {
		v.Samples = DefaultSamples
	}
	if v.MaxScan == 0 {
		v.MaxScan = DefaultVnodeMaxScan
	}
	switch {
	case v.SlotJitter == 0:
		v.SlotJitter = DefaultSlotJitter
	case v.SlotJitter < 0:
		v.SlotJitter = 0
	}
}

// Validate checks the seed's ranges, naming the field that is out: V 1-64,
// K 1-8, max_scan 1-256, slot_jitter 0-64, and the Limits.
func (v Vnode) Validate() error {
	switch {
	case v.VirtualNodes < 1 || v.VirtualNodes > MaxVirtualNodes:
		return fmt.Errorf("virtual_nodes %d: must be 1-%d (4-32 recommended)", v.VirtualNodes, MaxVirtualNodes)
	case v.Samples < 1 || v.Samples > MaxSamples:
		return fmt.Errorf("samples %d: must be 1-%d", v.Samples, MaxSamples)
	case v.MaxScan < 1 || v.MaxScan > MaxVnodeMaxScan:
		return fmt.Errorf("max_scan %d: must be 1-%d", v.MaxScan, MaxVnodeMaxScan)
	case v.SlotJitter < 0 || v.SlotJitter > MaxSlotJitter:
		return fmt.Errorf("slot_jitter %d: must be 0-%d", v.SlotJitter, MaxSlotJitter)
	}
	if err := v.Limits.Validate(); err != nil {
		return fmt.Errorf("vnode limits: %w", err)
	}
	return nil
}

// VnodeDraw is every random input of one vnode decision, drawn up front so
// that the registry can pass the same values to its Lua script and to
// Vnode.Select and get the same answer.
type VnodeDraw struct {
	// Pivots: one ring position per sample.
	Pivots []Pos
	// Jitter: one value in [0, SlotJitter) per sample, added to the
	// sample's candidate's active count.
	Jitter []int
	// Tiebreak chooses among candidates tied at the minimum.
	Tiebreak uint64
}

// samples is K as Select and Draw use it: at least 1.
func (v Vnode) samples() int { return max(v.Samples, 1) }

// Draw takes the decision's random inputs from r, in this order: for each
// of K samples a pivot (high 64 bits, then low 64 bits, each r.Uint64());
// then for each of K samples a jitter r.IntN(SlotJitter) (no draw, and 0,
// when SlotJitter <= 0); then Tiebreak = r.Uint64(). The jitter and
// tiebreak are drawn at K = 1 too, unused, so that the draw's shape depends
// only on K and SlotJitter. K < 1 counts as 1.
func (v Vnode) Draw(r Rand) VnodeDraw {
	k := v.samples()
	d := VnodeDraw{Pivots: make([]Pos, k), Jitter: make([]int, k)}
	for i := range d.Pivots {
		hi := r.Uint64()
		lo := r.Uint64()
		d.Pivots[i] = PosFrom(hi, lo)
	}
	if v.SlotJitter > 0 {
		for i := range d.Jitter {
			d.Jitter[i] = r.IntN(v.SlotJitter)
		}
	}
	d.Tiebreak = r.Uint64()
	return d
}

type vnodeCandidate struct {
	id    string
	slots int
}

// Select is the vnode design's allocation: K independent pivots on the ring, each
// resolved to the first eligible worker at or after it (wrapping past the
// end), then, at K >= 2, the candidate with the fewest active sessions plus
// jitter, ties broken by draw.Tiebreak. lookup returns a ring entry's
// worker record (false when it is gone). Decision.Index is always -1.
//
// Exactly (contract, "Vnode ring with power-of-K"):
//
//   - One budget of MaxScan (0: unbounded) is shared by all samples and
//     their wrap walks.
//   - Sample i walks the entries with Pos >= Pivots[i] in ring order; when
//     it reaches the end without a result it counts a wrap (even when the
//     wrapped range is empty) and walks the entries with Pos < Pivots[i]
//     from the start.
//   - Every entry walked counts in Scanned. A missing or not-fresh worker is
//     reported in Stale (once) and costs one unit of budget; a fresh worker
//     that is not Indexed or not Usable costs one unit. This is charged
//     every time an entry is walked, even for a worker already seen. When
//     the budget reaches 0 the whole decision stops: at K >= 2 it returns
//     the best of the candidates found so far, at K = 1 none.
//   - The first eligible entry resolves the sample. A worker already among
//     the candidates counts a dedupe and is not added again; otherwise it
//     joins with slots = Active + Jitter[i]. Effective is the number of
//     candidates (at K = 1 too).
//   - K = 1: the candidate, if any; no slot comparison, TiedMin false.
//   - K >= 2: the candidates at the minimum slots, in candidate order; the
//     pick is tied[Tiebreak % len(tied)]; TiedMin when len(tied) >= 2.
//
// draw should come from v.Draw; values it lacks read as zero.
func (v Vnode) Select(ring *Ring, lookup func(id string) (*Worker, bool), draw VnodeDraw, now time.Time) Decision {
	d := none()
	if ring == nil {
		return d
	}
	ring.sort()
	s := newScan(v.Limits, now, &d)
	k := v.samples()
	var cands []vnodeCandidate
	entries := ring.entries
	n := len(entries)

	// walk examines entries[from:to]; it returns the first eligible
	// worker (or nil) and whether the budget ran out.
	walk := func(from, to int) (string, *Worker, bool) {
		for j := from; j < to; j++ {
			id := entries[j].ID
			w, ok := lookup(id)
			if !ok {
				w = nil
			}
			eligible, exhausted := s.step(id, w)
			if eligible {
				return id, w, false
			}
			if exhausted {
				return "", nil, true
			}
		}
		return "", nil, false
	}

	exhausted := false
	for i := 0; i < k && !exhausted; i++ {
		var pivot Pos
		if i < len(draw.Pivots) {
			pivot = draw.Pivots[i]
		}
		start := ring.search(pivot)
		id, w, out := walk(start, n)
		if w == nil && !out {
			d.Wraps++
			id, w, out = walk(0, start)
		}
		exhausted = out
		if w == nil {
			continue
		}
		if slices.ContainsFunc(cands, func(c vnodeCandidate) bool { return c.id == id }) {
			d.Dedupes++
			continue
		}
		jitter := 0
		if i < len(draw.Jitter) {
			jitter = draw.Jitter[i]
		}
		cands = append(cands, vnodeCandidate{id: id, slots: w.Active + jitter})
	}
	d.Effective = len(cands)
	if len(cands) == 0 {
		return d
	}
	if k == 1 {
		d.ID, d.OK = cands[0].id, true
		return d
	}
	lo := cands[0].slots
	for _, c := range cands[1:] {
		lo = min(lo, c.slots)
	}
	tied := make([]string, 0, len(cands))
	for _, c := range cands {
		if c.slots == lo {
			tied = append(tied, c.id)
		}
	}
	d.ID, d.OK = tied[draw.Tiebreak%uint64(len(tied))], true
	d.TiedMin = len(tied) >= 2
	return d
}

// VnodeSelector adapts Vnode to a plain snapshot, for the simulator and
// tests: it keeps a ring of the snapshot's worker IDs (rebuilt when they
// change, which it checks in O(N) on every call) and draws from Rand on
// every call. For hot loops, call Vnode.Select with a ring and lookup of
// your own. Not safe for concurrent use.
type VnodeSelector struct {
	Vnode
	Rand Rand

	ring  *Ring
	ids   []string
	index map[string]int
}

// Select draws and decides over ws. Decision.Index is set to the chosen
// worker's index in ws.
func (s *VnodeSelector) Select(ws []Worker, now time.Time) Decision {
	if !s.sameIDs(ws) {
		s.ring, s.ids, s.index = NewRing(), s.ids[:0], make(map[string]int, len(ws))
		for i := range ws {
			s.ring.Add(ws[i].ID, max(s.VirtualNodes, 1))
			s.ids = append(s.ids, ws[i].ID)
			s.index[ws[i].ID] = i
		}
	}
	lookup := func(id string) (*Worker, bool) {
		i, ok := s.index[id]
		if !ok {
			return nil, false
		}
		return &ws[i], true
	}
	v := s.Vnode
	v.Limits = v.Limits.withRetiring(ws, now)
	d := v.Select(s.ring, lookup, s.Draw(s.Rand), now)
	if d.OK {
		d.Index = s.index[d.ID]
	}
	return d
}

func (s *VnodeSelector) sameIDs(ws []Worker) bool {
	if s.ring == nil || len(ws) != len(s.ids) {
		return false
	}
	for i := range ws {
		if ws[i].ID != s.ids[i] {
			return false
		}
	}
	return true
}

// Interface guards.
var _ Selector = (*VnodeSelector)(nil)
