package caddygrid

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// The dial policy: Caddy dials only the worker records it allows. Anyone
// who can write to the grid's Redis (every worker host holds those
// credentials) can write a record; without this check such a record could
// make Caddy dial any address it can reach (a cloud metadata service, an
// internal admin endpoint) on behalf of an anonymous client. A refused
// record is never dialed: its claim is given back, the worker is skipped
// by every instance for suspectFor, the refusal is reported (log,
// caddy_grid_bad_records_total, the admin API's bad_records) and the
// session claims another worker.

// DefaultWorkerNetworks are the networks a worker's address may be in when
// worker_networks is not set: loopback and the private ranges (RFC 1918,
// RFC 4193). Link-local (169.254.0.0/16, fe80::/10) is left out on purpose:
// it holds the cloud metadata services (169.254.169.254), the classic
// target of a forged address.
var DefaultWorkerNetworks = []string{
	"127.0.0.0/8", "::1/128",
	"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
	"fc00::/7",
}

const (
	// maxRefusedRecords bounds how many refused records one request walks
	// past before it gives up (503, as when no worker is free in time).
	maxRefusedRecords = 16
	// resolveTimeout bounds the lookup of a worker's host name (only with
	// allow_worker_hostnames).
	resolveTimeout = 2 * time.Second
)

// Reasons a record is refused: the reason label of
// caddy_grid_bad_records_total (a fixed set) and of the log line.
const (
	reasonUnparsable      = "unparsable"
	reasonNotTCP          = "not_host_port"
	reasonHostname        = "hostname"
	reasonResolve         = "resolve_failed"
	reasonOutsideNetworks = "outside_worker_networks"
	reasonBadPath         = "bad_path"
	reasonUnsigned        = "unsigned"
	reasonBadSignature    = "bad_signature"
)

// badRecords counts the worker records this instance skipped or refused.
var badRecords = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "caddy", Subsystem: "grid", Name: "bad_records_total",
	Help: "Worker records this instance skipped or refused to dial, by reason: unparsable, not_host_port, hostname, resolve_failed, outside_worker_networks, bad_path, unsigned, bad_signature.",
}, []string{"pool", "reason"})

// dialPolicy is what a worker record must satisfy to be dialed.
type dialPolicy struct {
	networks  []netip.Prefix
	hostnames bool
	secret    []byte
	resolver  *net.Resolver
}

// refusal is why a record is not dialed.
type refusal struct {
	reason string
	err    error
}

func (r *refusal) Error() string { return r.err.Error() }

func refuse(reason, format string, args ...any) *refusal {
	return &refusal{reason: reason, err: fmt.Errorf(format, args...)}
}

// parseWorkerNetworks parses CIDR prefixes (a bare IP is one address).
func parseWorkerNetworks(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		p, err := parseWorkerNetwork(s)
		if err != nil {
			return nil, fmt.Errorf("invalid worker_networks '%s': %w", s, err)
		}
		out = append(out, p)
	}
	return out, nil
}

func parseWorkerNetwork(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, errors.New("want a CIDR such as 10.0.0.0/8, or one IP")
		}
		return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("want a CIDR such as 10.0.0.0/8: %w", err)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, errors.New("write IPv4 networks as IPv4")
	}
	return p.Masked(), nil
}

// newDialPolicy builds the app's policy (networks already validated).
func (a *App) newDialPolicy() (*dialPolicy, error) {
	nets := a.WorkerNetworks
	if len(nets) == 0 {
		nets = DefaultWorkerNetworks
	}
	prefixes, err := parseWorkerNetworks(nets)
	if err != nil {
		return nil, fmt.Errorf("grid: %w", err)
	}
	p := &dialPolicy{networks: prefixes, hostnames: a.AllowWorkerHostnames, resolver: net.DefaultResolver}
	if a.WorkerSecret != "" {
		secret := caddy.NewReplacer().ReplaceAll(a.WorkerSecret, "")
		if strings.TrimSpace(secret) == "" {
			// An unset environment variable must not turn the check off.
			return nil, errors.New("grid: worker_secret is empty after expanding placeholders")
		}
		p.secret = []byte(secret)
	}
	return p, nil
}

// allowedIP reports whether ip is inside the worker networks.
func (p *dialPolicy) allowedIP(ip netip.Addr) bool {
	ip = ip.Unmap()
	for _, n := range p.networks {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

// check decides whether w may be dialed, and returns the address to dial:
// the record's, or with allow_worker_hostnames the checked IP its name
// resolved to (so a second lookup at dial time cannot answer otherwise).
func (p *dialPolicy) check(ctx context.Context, w *registry.Record) (string, *refusal) {
	if p.secret != nil {
		switch err := w.CheckSignature(p.secret); {
		case errors.Is(err, registry.ErrUnsigned):
			return "", refuse(reasonUnsigned, "record has no signature and worker_secret is set")
		case err != nil:
			return "", refuse(reasonBadSignature, "record signature does not verify with worker_secret")
		}
	}
	if r := checkWorkerPath(w.Path); r != nil {
		return "", r
	}
	return p.checkAddr(ctx, w.Addr)
}

func (p *dialPolicy) checkAddr(ctx context.Context, addr string) (string, *refusal) {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		if ap.Port() == 0 {
			return "", refuse(reasonNotTCP, "address %q has port 0", addr)
		}
		if !p.allowedIP(ap.Addr()) {
			return "", refuse(reasonOutsideNetworks, "address %q is outside worker_networks", addr)
		}
		return addr, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || strings.ContainsAny(addr, "/{}%@ \t\r\n") {
		return "", refuse(reasonNotTCP, "address %q is not host:port", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strings.Trim(port, "0123456789") != "" {
		return "", refuse(reasonNotTCP, "address %q has no valid port", addr)
	}
	if !p.hostnames {
		return "", refuse(reasonHostname, "address %q is a host name and allow_worker_hostnames is off", addr)
	}
	rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	ips, err := p.resolver.LookupNetIP(rctx, "ip", host)
	if err != nil || len(ips) == 0 {
		return "", refuse(reasonResolve, "resolving %q: %v", host, err)
	}
	// Every address must be allowed: which one a later lookup or a dialer
	// would use is not ours to choose.
	for _, ip := range ips {
		if !p.allowedIP(ip) {
			return "", refuse(reasonOutsideNetworks, "address %q resolves to %s, outside worker_networks", addr, ip)
		}
	}
	return net.JoinHostPort(ips[0].Unmap().String(), port), nil
}

// checkWorkerPath accepts an absolute path (with an optional query) whose
// segments, decoded, hold no "." or "..", and no scheme or host ("//x").
// "" stands for "/".
func checkWorkerPath(p string) *refusal {
	if p == "" {
		return nil
	}
	path, _, _ := strings.Cut(p, "?")
	if !strings.HasPrefix(path, "/") || strings.HasPrefix(path, "//") {
		return refuse(reasonBadPath, "path %q is not an absolute path", p)
	}
	if strings.ContainsAny(p, "#\\") {
		return refuse(reasonBadPath, "path %q holds '#' or '\\'", p)
	}
	for _, c := range p {
		if c < 0x20 || c == 0x7f {
			return refuse(reasonBadPath, "path %q holds a control character", p)
		}
	}
	dec, err := url.PathUnescape(path)
	if err != nil {
		return refuse(reasonBadPath, "path %q: %v", p, err)
	}
	for _, seg := range strings.Split(dec, "/") {
		if seg == ".." || seg == "." || strings.ContainsAny(seg, "\\\x00") {
			return refuse(reasonBadPath, "path %q has a '.' or '..' segment", p)
		}
	}
	return nil
}
