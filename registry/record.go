package registry

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// Protocol is the version of the upgrade exchange between Caddy and the
// agent (the Grid-Claim header and the refusals) and of the record's
// fields. Both refuse another, naming both versions.
const Protocol = 1

// MaxVirtualNodes is the most ring positions a worker may register.
const MaxVirtualNodes = selection.MaxVirtualNodes

// Record is a worker's registration: what Caddy needs to reach it, written
// once per browser by its agent.
type Record struct {
	// ID names the browser process, unique in its pool.
	ID string `json:"id"`
	// Pool is the pool, without the version.
	Pool string `json:"pool"`
	// Version is the Playwright major.minor the worker serves ("": any
	// client, e.g. a CDP worker).
	Version string `json:"version,omitempty"`
	// Browser is chromium, firefox or webkit.
	Browser string `json:"browser"`
	// Addr is the agent's host:port that Caddy dials.
	Addr string `json:"addr"`
	// Path is the browser's WebSocket path, e.g. "/playwright".
	Path string `json:"path"`
	// Capacity is how many sessions the worker takes at once (0: no limit
	// of its own).
	Capacity int `json:"capacity,omitempty"`
	// Weight is its turns per round under interleaved weighted round
	// robin, 1-10000.
	Weight int `json:"weight"`
	// Ring holds its ring positions for the vnode policy, as hex.
	Ring []string `json:"ring"`
	// Protocol is the agent's Protocol.
	Protocol int `json:"protocol"`
	// Launcher is how the agent runs the browser (playwright,
	// playwright-server, cdp, exec, fake), for views.
	Launcher string `json:"launcher,omitempty"`
	// Video says whether the worker can record video.
	Video bool `json:"video,omitempty"`
	// Registered is when the browser registered (Unix ms).
	Registered int64 `json:"registered"`
	// Sig signs Pool, Version, ID, Addr and Path with the worker secret,
	// or is empty.
	Sig string `json:"sig,omitempty"`
}

// NewRecord fills a record's derived fields (ring positions, weight,
// registration time, protocol, signature) for a worker with v ring
// positions (0: the default, 8) and secret (nil: unsigned).
func NewRecord(rec Record, v int, secret []byte) Record {
	if v <= 0 {
		v = selection.DefaultVirtualNodes
	}
	rec.Ring = nil
	for _, p := range selection.Positions(rec.ID, v) {
		rec.Ring = append(rec.Ring, p.String())
	}
	if rec.Weight <= 0 {
		rec.Weight = max(rec.Capacity, 1)
	}
	rec.Protocol = Protocol
	if rec.Registered == 0 {
		rec.Registered = time.Now().UnixMilli()
	}
	rec.Sig = ""
	if len(secret) > 0 {
		rec.Sig = rec.signature(secret)
	}
	return rec
}

// Group is the version group the worker registers in.
func (rec *Record) Group() string { return GroupPool(rec.Pool, rec.Version) }

// check reports why a record cannot be registered.
func (rec *Record) check() error {
	if err := CheckPool(rec.Pool); err != nil {
		return err
	}
	if strings.Contains(rec.Pool, groupSep) {
		return fmt.Errorf("record pool %q: name the version in Version, not the pool", rec.Pool)
	}
	if rec.Version != "" {
		if err := CheckVersion(rec.Version); err != nil {
			return err
		}
	}
	if err := CheckID(rec.ID); err != nil {
		return fmt.Errorf("worker %w", err)
	}
	if _, _, err := net.SplitHostPort(rec.Addr); err != nil {
		return fmt.Errorf("worker %s: address %q is not host:port", rec.ID, rec.Addr)
	}
	if !strings.HasPrefix(rec.Path, "/") {
		return fmt.Errorf("worker %s: path %q must start with /", rec.ID, rec.Path)
	}
	if rec.Capacity < 0 || rec.Weight < 0 || rec.Weight > selection.MaxWeight {
		return fmt.Errorf("worker %s: capacity %d, weight %d out of range", rec.ID, rec.Capacity, rec.Weight)
	}
	return nil
}

// DecodeRecord reads a record as Redis holds it. A record that does not
// parse, or names another ID, or speaks another protocol, is an error:
// the caller skips it and says why.
func DecodeRecord(id, raw string) (Record, error) {
	var rec Record
	if err := json.Unmarshal([]byte(raw), &rec); err != nil {
		return Record{}, fmt.Errorf("worker %q: record does not parse: %v", id, err)
	}
	if rec.ID != id {
		return Record{}, fmt.Errorf("worker %q: record names worker %q", id, rec.ID)
	}
	if rec.Protocol != Protocol {
		return Record{}, fmt.Errorf("worker %q: its agent speaks grid protocol %d, this build %d; upgrade the older side (CHANGELOG.md)", id, rec.Protocol, Protocol)
	}
	if err := rec.check(); err != nil {
		return Record{}, err
	}
	return rec, nil
}
