package registry

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The upgrade exchange between Caddy and the agent. Caddy's upgrade
// request to the agent carries the claim in one header, HeaderClaim; the
// agent answers 101 from the browser, or refuses with 503 and
// HeaderRefused naming the reason, which Caddy tells apart from a broken
// worker: it blames nothing and tries another worker.
const (
	// HeaderClaim carries a Ticket. Caddy replaces any a client sends.
	HeaderClaim = "Grid-Claim"
	// HeaderRefused names why the agent refused: one of the Refused* reasons.
	HeaderRefused = "Grid-Refused"
	// HeaderSession is the session's ID, on the 101 answer to the client.
	HeaderSession = "Grid-Session"
)

// The reasons an agent refuses a claim.
const (
	// RefusedFull: the browser holds the claim's max_concurrent sessions.
	RefusedFull = "full"
	// RefusedSpent: the browser has served the claim's max_lifetime.
	RefusedSpent = "spent"
	// RefusedDraining: the browser drains.
	RefusedDraining = "draining"
	// RefusedHeld: this would be the browser's last session, and the
	// agent still drains the browser it replaced.
	RefusedHeld = "held"
	// RefusedGone: no browser of that worker ID runs behind this agent.
	RefusedGone = "gone"
)

// Ticket is a claim as the agent receives it.
type Ticket struct {
	Protocol int
	Session  string
	// Group is the worker's version group; Worker its ID.
	Group  string
	Worker string
	// Client is the hash of the client's key ("" none), for client_limit.
	Client string
	Limits Limits
	// MaxSession and IdleTimeout end the session when they pass (0: never).
	MaxSession  time.Duration
	IdleTimeout time.Duration
	// Args are the Chromium flags Caddy read from the client's launch
	// options and its route's launch_args allow: the flags the agent
	// applies, whatever else the request says.
	Args []string
	// Issued is when Caddy sent the claim (Signed sets it); an agent takes
	// a claim within TicketWindow of it, once.
	Issued time.Time
	// Sig signs the rest with the worker secret ("" without one).
	Sig string
}

// TicketWindow is how far a claim's Issued may be from the agent's clock:
// a signed claim seen on the way cannot be used again later, and within
// the window the agent takes each session's claim once.
const TicketWindow = time.Minute

// Fresh reports why the agent must not take t at now (nil: it may).
func (t Ticket) Fresh(now time.Time) error {
	if d := now.Sub(t.Issued); d > TicketWindow || d < -TicketWindow {
		return fmt.Errorf("%s header: issued %s from this agent's clock, more than %s: the clocks of Caddy and this agent differ, or the claim is replayed",
			HeaderClaim, d.Round(time.Millisecond), TicketWindow)
	}
	return nil
}

const ticketLabel = "browser-grid claim v1"

// fields are what the signature covers; the flags only when there are
// some, so a claim without flags reads the same to every agent.
func (t Ticket) fields() []string {
	f := []string{strconv.Itoa(t.Protocol), t.Session, t.Group, t.Worker, orDash(t.Client), strconv.Itoa(t.Limits.MaxConcurrent),
		strconv.Itoa(t.Limits.MaxLifetime), strconv.FormatInt(t.MaxSession.Milliseconds(), 10),
		strconv.FormatInt(t.IdleTimeout.Milliseconds(), 10), strconv.FormatInt(t.Issued.UnixMilli(), 10)}
	if a := t.argsField(); a != "" {
		f = append(f, a)
	}
	return f
}

// argsField is Args as the header carries them: their JSON, base64url.
func (t Ticket) argsField() string {
	if len(t.Args) == 0 {
		return ""
	}
	raw, _ := json.Marshal(t.Args)
	return base64.RawURLEncoding.EncodeToString(raw)
}

// Signed returns t signed with secret (unsigned without one).
func (t Ticket) Signed(secret []byte) Ticket {
	t.Protocol = Protocol
	t.Sig = ""
	if t.Issued.IsZero() {
		t.Issued = time.Now()
	}
	if len(secret) > 0 {
		t.Sig = Sign(secret, ticketLabel, t.fields()...)
	}
	return t
}

// String is the header's value.
func (t Ticket) String() string {
	f := t.fields()
	s := "v=" + f[0] + ";session=" + f[1] + ";group=" + f[2] + ";worker=" + f[3] + ";client=" + f[4] + ";max-concurrent=" + f[5] +
		";max-lifetime=" + f[6] + ";max-session=" + f[7] + ";idle-timeout=" + f[8] + ";at=" + f[9]
	if len(f) > 10 {
		s += ";args=" + f[10]
	}
	if t.Sig != "" {
		s += ";sig=" + t.Sig
	}
	return s
}

// ParseTicket reads a HeaderClaim value and checks its signature against
// secret (nil: none is needed). The error says what is wrong, naming both
// protocol versions when they differ.
func ParseTicket(v string, secret []byte) (Ticket, error) {
	var t Ticket
	seen := map[string]bool{}
	for _, kv := range strings.Split(v, ";") {
		k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || seen[k] {
			return Ticket{}, fmt.Errorf("%s header: %q is not key=value, once each", HeaderClaim, kv)
		}
		seen[k] = true
		num := func(dst *int) error {
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 {
				return fmt.Errorf("%s header: %s=%q is not a count", HeaderClaim, k, val)
			}
			*dst = n
			return nil
		}
		var n int
		var err error
		switch k {
		case "v":
			err = num(&t.Protocol)
		case "session":
			t.Session, err = val, CheckID(val)
		case "group":
			t.Group, err = val, CheckPool(val)
		case "worker":
			t.Worker, err = val, CheckID(val)
		case "client":
			if err = CheckID(val); err == nil && val != "-" {
				t.Client = val
			}
		case "max-concurrent":
			err = num(&t.Limits.MaxConcurrent)
		case "max-lifetime":
			err = num(&t.Limits.MaxLifetime)
		case "max-session":
			err = num(&n)
			t.MaxSession = time.Duration(n) * time.Millisecond
		case "idle-timeout":
			err = num(&n)
			t.IdleTimeout = time.Duration(n) * time.Millisecond
		case "at":
			var ms int64
			if ms, err = strconv.ParseInt(val, 10, 64); err != nil || ms <= 0 {
				err = fmt.Errorf("%s header: at=%q is not a time (Unix milliseconds)", HeaderClaim, val)
			}
			t.Issued = time.UnixMilli(ms)
		case "args":
			// one form only: the JSON Caddy writes, in strict base64url
			raw, derr := base64.RawURLEncoding.Strict().DecodeString(val)
			if derr == nil {
				t.Args, derr = readArgs(raw)
			}
			if derr != nil || len(t.Args) == 0 || t.argsField() != val {
				err = fmt.Errorf("%s header: args=%q is not a list of flags as Caddy writes it (%v)", HeaderClaim, val, orNull(derr))
			}
		case "sig":
			t.Sig = val
		default:
			err = fmt.Errorf("%s header: unknown field %q", HeaderClaim, k)
		}
		if err != nil {
			return Ticket{}, err
		}
	}
	if t.Protocol != Protocol {
		return Ticket{}, fmt.Errorf("this agent speaks grid protocol %d and Caddy sent protocol %d: run the same release on both (CHANGELOG.md)", Protocol, t.Protocol)
	}
	if t.Session == "" || t.Worker == "" || t.Group == "" || t.Issued.IsZero() {
		return Ticket{}, fmt.Errorf("%s header: no session, group, worker or issue time (at)", HeaderClaim)
	}
	if len(secret) > 0 && !SignatureOK(t.Sig, Sign(secret, ticketLabel, t.fields()...)) {
		return Ticket{}, fmt.Errorf("%s header: the signature does not verify with this agent's worker secret", HeaderClaim)
	}
	return t, nil
}
