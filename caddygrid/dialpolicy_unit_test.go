package caddygrid

import (
	"context"
	"testing"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// TestDialPolicyCheck: which worker addresses and paths the default
// policy dials, and why it refuses the others.
func TestDialPolicyCheck(t *testing.T) {
	def, err := (&App{}).newDialPolicy()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, addr, path string
		reason           string // "" = dialed
	}{
		{"loopback", "127.0.0.1:9000", "/playwright", ""},
		{"loopback alias", "127.3.4.5:9000", "/", ""},
		{"ipv6 loopback", "[::1]:9000", "/playwright", ""},
		{"rfc1918 10", "10.1.2.3:3000", "/playwright", ""},
		{"rfc1918 172.16", "172.31.255.1:3000", "/playwright", ""},
		{"rfc1918 192.168", "192.168.7.7:3000", "/playwright", ""},
		{"ula", "[fd00::2]:3000", "/playwright", ""},
		{"v4-mapped loopback", "[::ffff:127.0.0.1]:3000", "/playwright", ""},
		{"empty path is /", "10.0.0.1:3000", "", ""},
		{"path with a query", "10.0.0.1:3000", "/devtools/browser/abc?token=x", ""},
		{"public address", "8.8.8.8:80", "/playwright", reasonOutsideNetworks},
		{"172.32 is public", "172.32.0.1:80", "/playwright", reasonOutsideNetworks},
		{"cloud metadata (link-local)", "169.254.169.254:80", "/latest/meta-data/", reasonOutsideNetworks},
		{"ipv6 link-local", "[fe80::1]:80", "/", reasonOutsideNetworks},
		{"ipv6 zone", "[fe80::1%eth0]:80", "/", reasonOutsideNetworks},
		{"v4-mapped public", "[::ffff:8.8.8.8]:80", "/", reasonOutsideNetworks},
		{"unspecified", "0.0.0.0:80", "/", reasonOutsideNetworks},
		{"unix socket", "unix//run/internal.sock", "/internal/admin", reasonUnix},
		{"unix h2c", "unix+h2c//run/internal.sock", "/", reasonNotTCP},
		{"network prefix", "tcp/127.0.0.1:80", "/", reasonNotTCP},
		{"port 0", "127.0.0.1:0", "/", reasonNotTCP},
		{"no port", "127.0.0.1", "/", reasonNotTCP},
		{"placeholder", "{env.HOST}:80", "/", reasonNotTCP},
		{"userinfo", "a@127.0.0.1:80", "/", reasonNotTCP},
		{"named port", "localhost:http", "/", reasonNotTCP},
		{"host name", "localhost:9000", "/playwright", reasonHostname},
		{"dotdot", "127.0.0.1:9000", "/playwright/../admin", reasonBadPath},
		{"encoded dotdot", "127.0.0.1:9000", "/playwright/%2e%2E/admin", reasonBadPath},
		{"encoded slash dotdot", "127.0.0.1:9000", "/playwright/..%2fadmin", reasonBadPath},
		{"trailing dotdot", "127.0.0.1:9000", "/a/..", reasonBadPath},
		{"dot", "127.0.0.1:9000", "/./admin", reasonBadPath},
		{"relative", "127.0.0.1:9000", "admin", reasonBadPath},
		{"scheme", "127.0.0.1:9000", "http://evil.example/x", reasonBadPath},
		{"scheme-relative host", "127.0.0.1:9000", "//evil.example/x", reasonBadPath},
		{"backslash", "127.0.0.1:9000", "/a\\..\\admin", reasonBadPath},
		{"fragment", "127.0.0.1:9000", "/a#b", reasonBadPath},
		{"control character", "127.0.0.1:9000", "/a\r\nX-Injected: 1", reasonBadPath},
		{"bad escape", "127.0.0.1:9000", "/a%zz", reasonBadPath},
		{"encoded nul", "127.0.0.1:9000", "/a%00b", reasonBadPath},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := registry.WorkerInfo{Pool: "chromium", ID: "w", Addr: tc.addr, Path: tc.path}
			addr, r := def.check(context.Background(), &w)
			switch {
			case tc.reason == "" && r != nil:
				t.Errorf("refused (%s: %v), want dialed", r.reason, r.err)
			case tc.reason == "" && addr != tc.addr:
				t.Errorf("dials %q, want the record's %q", addr, tc.addr)
			case tc.reason != "" && r == nil:
				t.Errorf("dialed %q, want refused for %s", addr, tc.reason)
			case tc.reason != "" && r.reason != tc.reason:
				t.Errorf("refused for %s (%v), want %s", r.reason, r.err, tc.reason)
			}
		})
	}
}

// TestDialPolicyOptions: worker_networks replaces the defaults,
// allow_unix_workers admits unix sockets, allow_worker_hostnames resolves
// a name and dials the checked IP only when every address is allowed.
func TestDialPolicyOptions(t *testing.T) {
	check := func(a *App, addr string) (string, string) {
		t.Helper()
		p, err := a.newDialPolicy()
		if err != nil {
			t.Fatal(err)
		}
		w := registry.WorkerInfo{Pool: "chromium", ID: "w", Addr: addr, Path: "/playwright"}
		got, r := p.check(context.Background(), &w)
		if r != nil {
			return "", r.reason
		}
		return got, ""
	}
	narrow := &App{WorkerNetworks: []string{"127.0.0.2/32", "10.9.0.0/16"}}
	for addr, want := range map[string]string{
		"127.0.0.2:80": "", "10.9.3.4:80": "",
		"127.0.0.1:80": reasonOutsideNetworks, "10.8.0.1:80": reasonOutsideNetworks, "192.168.0.1:80": reasonOutsideNetworks,
	} {
		if _, got := check(narrow, addr); got != want {
			t.Errorf("networks %v, %s: reason %q, want %q", narrow.WorkerNetworks, addr, got, want)
		}
	}
	if _, got := check(&App{AllowUnixWorkers: true}, "unix//run/browser.sock"); got != "" {
		t.Errorf("allow_unix_workers: unix socket refused (%s)", got)
	}
	if _, got := check(&App{AllowUnixWorkers: true}, "unix/"); got != reasonUnix {
		t.Errorf("allow_unix_workers: empty socket path: %q, want %s", got, reasonUnix)
	}
	names := &App{AllowWorkerHostnames: true}
	if got, reason := check(names, "localhost:9000"); reason != "" || (got != "127.0.0.1:9000" && got != "[::1]:9000") {
		t.Errorf("allow_worker_hostnames: localhost:9000 gives %q (%s), want its loopback IP", got, reason)
	}
	names.WorkerNetworks = []string{"10.0.0.0/8"}
	if _, reason := check(names, "localhost:9000"); reason != reasonOutsideNetworks {
		t.Errorf("allow_worker_hostnames, networks 10/8: localhost refused for %q, want %s", reason, reasonOutsideNetworks)
	}
	if _, reason := check(names, "no-such-host.invalid:9000"); reason != reasonResolve {
		t.Errorf("a name that does not resolve: %q, want %s", reason, reasonResolve)
	}
	for _, bad := range []string{"10.0.0.0/33", "intranet", "::ffff:10.0.0.0/104", "fe80::1%eth0"} {
		if _, err := (&App{WorkerNetworks: []string{bad}}).newDialPolicy(); err == nil {
			t.Errorf("worker_networks %q accepted", bad)
		}
	}
	t.Setenv("GRID_TEST_UNSET_SECRET", "")
	if _, err := (&App{WorkerSecret: "{env.GRID_TEST_UNSET_SECRET}"}).newDialPolicy(); err == nil {
		t.Error("a worker_secret that expands to nothing was accepted (it would turn the check off)")
	}
}
