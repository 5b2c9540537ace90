package caddygrid

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/coder/websocket"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// The fuzz targets of the request path and the admin routes (make fuzz
// runs each for 25,000 inputs). They run in this process: the handler's
// front checks, the admin routes against a real Redis, the client key.

// fuzzSpecs are the ways a route finds its pool.
var fuzzSpecs = []poolSpec{
	{},
	{pool: "chromium"},
	{pool: "{http.request.uri.query.b}", browsers: []string{"chromium", "firefox"}},
}

// FuzzClientRequest sends the browser_grid handler any request (method,
// path, query, protocol, headers, body). Whatever it is, nothing panics;
// a request the handler refuses gets a 4xx with a sentence, and no claim
// is begun for it (so no worker is tried, let alone made suspect); a
// request it lets through is one a WebSocket server accepts once
// reverse_proxy has forwarded it (RFC 6455 4.2.1, checked by another
// implementation: coder/websocket's, the fake browser's), with
// extensions that parse (RFC 6455 9.1, checked by a parser of its own
// here), to a pool the route serves, so the browser's answer cannot
// blame the worker for the client's request, and with no launch option
// or exposeNetwork pattern the route does not allow, in the header or the
// query, read as Playwright's server reads them (the query's first value,
// else every header value joined). A well-formed upgrade to a served
// pool is let through whatever other headers it carries.
func FuzzClientRequest(f *testing.F) {
	valid := "Connection: Upgrade\nUpgrade: websocket\nSec-WebSocket-Version: 13\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\n"
	f.Add("GET", "/playwright/chromium", "", 1, valid, int8(0), false, uint8(0), false)
	f.Add("GET", "/playwright/x", "browser=firefox", 1, "", int8(0), false, uint8(0), true)
	f.Add("GET", "/p", "b=chromium", 1, "User-Agent: Playwright/1.65.1 (x64)\nGrid-Label: t1", int8(0), false, uint8(2), true)
	f.Add("GET", "/playwright/chromium", "", 1, valid+"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits", int8(0), false, uint8(1), false)
	f.Add("GET", "/playwright/chromium", "", 1, "Connection: keep-alive, Upgrade, Sec-WebSocket-Key\nUpgrade: websocket\nSec-WebSocket-Version: 13\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", int8(0), false, uint8(0), false)
	f.Add("GET", "/playwright/chromium", "", 1, valid+"Sec-WebSocket-Extensions: x; a=\"b\\\"c\"", int8(0), false, uint8(0), false)
	f.Add("POST", "/playwright/chromium", "", 1, valid, int8(5), true, uint8(0), false)
	f.Add("GET", "/playwright/chromium", "", 2, "", int8(-1), false, uint8(1), false)
	f.Add("CONNECT", "/playwright/chromium", "", 2, ":protocol: websocket\nSec-WebSocket-Version: 13", int8(-1), false, uint8(0), false)
	f.Add("GET", "/playwright/"+strings.Repeat("a", 70), "", 1, valid, int8(0), false, uint8(0), false)
	f.Add("GET", "/playwright/chromium", "", 1, "Connection: Upgrade\nUpgrade: h2c, websocket\nSec-WebSocket-Version: 13\nSec-WebSocket-Key: AAAAAAAAAAAAAAAAAAAAAA==", int8(0), false, uint8(0), false)
	f.Add("GET", "/playwright/chromium", "", 1, valid+`X-Playwright-Launch-Options: {"proxy":{"server":"http://p:1"},"args":["--x"]}`, int8(0), false, uint8(0), false)
	f.Add("GET", "/playwright/chromium", `launch-options={"executablePath":"/bin/sh"}`, 1, valid, int8(0), false, uint8(0), false)
	f.Add("GET", "/playwright/chromium", "proxy=*", 1, valid+"X-Playwright-Proxy: localhost", int8(0), false, uint8(0), false)
	f.Add("GET", "/playwright/chromium", `launch-options={"executablePath":"/bin/sh","x":";"}`, 1, valid, int8(0), false, uint8(0), false)
	f.Add("GET", "/playwright/chromium", `a=%zz&launch-options={"args":["--x"]}`, 1, valid, int8(0), false, uint8(0), false)
	f.Add("GET", "/playwright/chromium", "launch-options=null", 1, valid, int8(0), false, uint8(0), false)
	f.Add("GET", "/playwright/chromium", "", 1, valid+`X-Playwright-Launch-Options: {"slowMo":1}`+"\n"+`X-Playwright-Launch-Options: "headless":false}`, int8(0), false, uint8(0), false)
	f.Add("GET", "/playwright/chromium", "", 1, valid+`X-Playwright-Launch-Options: {"args":["--accept-lang=de","--window-size=8,6"]}`, int8(0), false, uint8(0), false)
	f.Add("GET", "/playwright/chromium", `launch-options={"args":["--accept-lang=de","-no-sandbox"]}`, 1, valid, int8(0), false, uint8(0), false)
	f.Fuzz(func(t *testing.T, method, path, query string, proto int, headers string, bodyLen int8, chunked bool, specN uint8, canonical bool) {
		spec := fuzzSpecs[int(specN)%len(fuzzSpecs)]
		r, plain := fuzzRequest(method, path, query, proto, headers, bodyLen, chunked, canonical)
		if r == nil {
			return
		}
		h := &Handler{spec: spec, logger: zap.NewNop(), selectTimeout: time.Second, LaunchArgs: fuzzLaunchArgs}
		retries := DefaultDialRetries
		h.DialRetries = &retries

		// The label and the version are read from every request; neither
		// may carry what Redis' values or the 428's text cannot hold.
		if l := sessionLabel(r); len(l) > 64 || !utf8.ValidString(l) || strings.ContainsFunc(l, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
			t.Fatalf("label %q: more than 64 bytes, invalid UTF-8 or a control character", l)
		}
		if v := clientVersion(r); v != "" && registry.CheckVersion(v) != nil {
			t.Fatalf("client version %q is no major.minor", v)
		}

		_, poolErr := spec.resolve(r)
		clone := r.Clone(r.Context())
		code, _ := checkHandshake(clone)
		body := r.ProtoMajor == 1 && (r.ContentLength != 0 || len(r.TransferEncoding) > 0)
		_, refusal := h.checkLaunch(clone)
		launchRefused := refusal != ""
		if !isWebSocket(r) || body || poolErr != nil || code != 0 || launchRefused {
			rec := httptest.NewRecorder()
			if err := h.ServeHTTP(rec, r, nil); err != nil {
				t.Fatalf("ServeHTTP: %v", err)
			}
			if rec.Code < 400 || rec.Code >= 500 {
				t.Fatalf("a refused request got %d, want a 4xx", rec.Code)
			}
			if msg := rec.Body.String(); len(msg) < 10 || !strings.HasSuffix(msg, "\n") {
				t.Fatalf("a refused request got the body %q, want a sentence", msg)
			}
			if r.ProtoMajor != 1 && (rec.Header().Get("Connection") != "" || rec.Header().Get("Upgrade") != "") {
				t.Fatalf("an HTTP/%d answer carries Connection or Upgrade: %v", r.ProtoMajor, rec.Header())
			}
			if attemptOf(r) != nil {
				t.Fatal("a refused request began a claim")
			}
			if plain && poolErr == nil && !launchRefused {
				t.Fatalf("a well-formed upgrade to a served pool was refused with %d %q", rec.Code, rec.Body)
			}
			return
		}

		// Let through: what reverse_proxy sends the worker must be a
		// handshake a WebSocket server accepts.
		pool, _ := spec.resolve(r)
		if !regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`).MatchString(pool) || !slices.Contains(spec.allowed(), pool) {
			t.Fatalf("pool %q let through, the route serves %v", pool, spec.allowed())
		}
		fwd := clone.Clone(context.Background())
		fwd.Method, fwd.Proto, fwd.ProtoMajor, fwd.ProtoMinor = http.MethodGet, "HTTP/1.1", 1, 1
		if r.ProtoMajor != 1 {
			// reverse_proxy turns an extended CONNECT into an HTTP/1.1
			// upgrade with a key of its own.
			delete(fwd.Header, ":protocol")
			fwd.Header.Set("Upgrade", "websocket")
			fwd.Header.Set("Connection", "Upgrade")
			fwd.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		}
		rec := httptest.NewRecorder()
		_, _ = websocket.Accept(rec, fwd, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if rec.Code != http.StatusNotImplemented {
			// 501: the handshake checked out, and Accept stopped at
			// taking over the recorder's connection, which it cannot.
			t.Fatalf("let through, but a WebSocket server answers %d %q to\n%v", rec.Code, rec.Body, fwd.Header)
		}
		for _, v := range headerValues(fwd.Header, "Sec-WebSocket-Extensions") {
			if !rfcExtensions(v) {
				t.Fatalf("let through with Sec-WebSocket-Extensions %q, which RFC 6455 9.1 does not parse", v)
			}
		}
		if bad := playwrightReads(fwd, DefaultLaunchOptions); bad != "" {
			t.Fatalf("let through, but Playwright's server would read %s", bad)
		}
	})
}

// fuzzLaunchArgs are the flags the fuzzed route allows.
var fuzzLaunchArgs = []string{"--accept-lang", "--window-size"}

// playwrightReads names what a Playwright server would apply from r's
// launch options beyond allowed, the options it keeps its own value of
// and headless true ("" nothing), reading them its own way: the query's
// first launch-options, else the header's values joined as Node joins
// them. An exposeNetwork pattern is allowed (expose_network's default).
func playwrightReads(r *http.Request, allowed []string) string {
	raw := nodeQueryGet(r.URL.RawQuery, "launch-options")
	if raw == "" {
		raw = strings.Join(r.Header.Values("X-Playwright-Launch-Options"), ", ")
	}
	var opts map[string]any
	if json.Unmarshal([]byte(raw), &opts) != nil {
		return "" // Playwright falls back to its defaults
	}
	if strings.TrimSpace(raw) == "null" {
		return "null launch options, which stop Playwright's server"
	}
	keeps := []string{"handleSIGINT", "handleSIGTERM", "handleSIGHUP", "timeout", "tracesDir", "artifactsDir", "downloadsPath"}
	for k, v := range opts {
		switch {
		case slices.Contains(allowed, k), slices.Contains(keeps, k):
		case k == "headless" && v == true:
		case k == "args":
			if bad := argsBeyond(v, fuzzLaunchArgs); bad != "" {
				return "the flag " + bad
			}
		default:
			return fmt.Sprintf("the launch option %s (%v)", k, v)
		}
	}
	return ""
}

// argsBeyond names the first of args that is no flag of allowed, as
// Chromium reads a flag ("" none).
func argsBeyond(args any, allowed []string) string {
	if args == nil {
		return ""
	}
	list, ok := args.([]any)
	if !ok {
		return fmt.Sprint(args)
	}
	for _, a := range list {
		s, ok := a.(string)
		name, _, _ := strings.Cut(s, "=")
		if !ok || !slices.Contains(allowed, name) {
			return fmt.Sprint(a)
		}
	}
	return ""
}

// fuzzRequest builds a request as Go's HTTP server hands it over: header
// names that are tokens, in canonical form, and values trimmed, without
// control characters; nil when the method or path could not come from
// one. plain reports a well-formed upgrade: HTTP/1.1 GET without a
// body, the canonical handshake headers, and others that do not touch
// the handshake.
func fuzzRequest(method, path, query string, proto int, headers string, bodyLen int8, chunked, canonical bool) (*http.Request, bool) {
	if method == "" {
		method = http.MethodGet
	}
	if !isToken(method) || !strings.HasPrefix(path, "/") || strings.ContainsAny(path+query, " \r\n\x00#") {
		return nil, false
	}
	r := &http.Request{Method: method, URL: &url.URL{Path: path, RawQuery: query}, Header: http.Header{},
		Host: "grid.example", RemoteAddr: "192.0.2.7:40000", RequestURI: path}
	switch proto % 3 {
	case 0:
		r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/1.0", 1, 0
	case 1, -1:
		r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/1.1", 1, 1
	default:
		r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/2.0", 2, 0
	}
	plain := canonical && method == http.MethodGet && r.ProtoMajor == 1 && r.ProtoMinor == 1 && bodyLen == 0 && !chunked
	if canonical {
		r.Header.Set("Connection", "Upgrade")
		r.Header.Set("Upgrade", "websocket")
		r.Header.Set("Sec-WebSocket-Version", "13")
		r.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	}
	for _, line := range strings.Split(headers, "\n") {
		name, value, ok := strings.Cut(line, ":")
		if name == "" && strings.HasPrefix(value, "protocol:") && r.ProtoMajor == 2 {
			// the HTTP/2 server's pseudo-header of an extended CONNECT
			r.Header[":protocol"] = []string{strings.Trim(strings.TrimPrefix(value, "protocol:"), " \t")}
			continue
		}
		value = strings.Trim(value, " \t")
		if !ok || !isToken(name) || strings.ContainsFunc(value, func(c rune) bool { return c < 0x20 && c != '\t' || c == 0x7f }) {
			continue
		}
		if r.ProtoMajor == 2 && strings.EqualFold(name, "Connection") {
			continue // an HTTP/2 server refuses the request
		}
		lower := strings.ToLower(name)
		if lower == "connection" || lower == "upgrade" || strings.HasPrefix(lower, "sec-websocket-") ||
			lower == "content-length" || lower == "transfer-encoding" {
			plain = false
		}
		r.Header.Add(name, value)
	}
	r.ContentLength = int64(bodyLen)
	if chunked {
		r.TransferEncoding = []string{"chunked"}
	}
	vars := map[string]any{caddyhttp.ClientIPVarKey: "192.0.2.7"}
	r = r.WithContext(context.WithValue(context.Background(), caddyhttp.VarsCtxKey, vars))
	caddyhttp.NewTestReplacer(r)
	return r, plain
}

// rfcExtensions parses an extension list by RFC 6455 9.1, apart from the
// handler's own parser: 1#( token *( ";" token [ "=" ( token |
// quoted-string ) ] ) ), where a quoted value, unquoted, is a token too.
func rfcExtensions(v string) bool {
	p := 0
	ows := func() {
		for p < len(v) && (v[p] == ' ' || v[p] == '\t') {
			p++
		}
	}
	token := func() bool {
		start := p
		for p < len(v) && tchar(v[p]) {
			p++
		}
		return p > start
	}
	for {
		ows()
		if !token() {
			return false
		}
		ows()
		for p < len(v) && v[p] == ';' {
			p++
			ows()
			if !token() {
				return false
			}
			ows()
			if p < len(v) && v[p] == '=' {
				p++
				ows()
				if p < len(v) && v[p] == '"' {
					p++
					var val []byte
					for {
						if p >= len(v) {
							return false
						}
						c := v[p]
						p++
						if c == '"' {
							break
						}
						if c == '\\' {
							if p >= len(v) {
								return false
							}
							c = v[p]
							p++
						}
						val = append(val, c)
					}
					if len(val) == 0 || slices.ContainsFunc(val, func(c byte) bool { return !tchar(c) }) {
						return false
					}
				} else if !token() {
					return false
				}
				ows()
			}
		}
		if p == len(v) {
			return true
		}
		if v[p] != ',' {
			return false
		}
		p++
	}
}

// tchar is RFC 9110's token character.
func tchar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// FuzzAdminAPI sends the grid's admin routes any method, path and query,
// with a real grid app on a real Redis holding a worker, a versioned
// worker and a session. Nothing panics, and the answer is 200 for a route
// that exists with its arguments right, else a 4xx (an unknown route
// 404): never a 5xx, which with Redis up would mean the route took a bad
// argument for a fault of the grid's.
func FuzzAdminAPI(f *testing.F) {
	startFuzzApp(f)
	for _, seed := range [][3]string{
		{"GET", "pools", ""}, {"GET", "pools/chromium", ""}, {"GET", "pools/chromium/pick", "version=1.65"},
		{"POST", "pools/chromium/workers/fz-1/drain", ""}, {"GET", "sessions", "pool=chromium"},
		{"GET", "sessions", "cursor=0.0"}, {"GET", "sessions/fz-session", ""}, {"DELETE", "sessions/fz-session", ""},
		{"GET", "pools/chromium@1.65/pick", "version=1.65"}, {"POST", "pools/a b/workers/x/drain", ""},
		{"PUT", "pools", ""}, {"GET", "sessions/" + strings.Repeat("x", 300), ""}, {"GET", "pools//", ""},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	f.Fuzz(func(t *testing.T, method, path, query string) {
		if method == "" || !isToken(method) {
			return
		}
		r := &http.Request{Method: method, URL: &url.URL{Path: "/grid/" + path, RawQuery: query}, Header: http.Header{}}
		r = r.WithContext(context.Background())
		rec := httptest.NewRecorder()
		code := http.StatusOK
		if err := serveAdmin(rec, r); err != nil {
			var ae caddy.APIError
			if !errors.As(err, &ae) {
				t.Fatalf("%s %q: an error Caddy answers 500: %v", method, r.URL.Path, err)
			}
			code = ae.HTTPStatus
		}
		if code != http.StatusOK && (code < 400 || code >= 500) {
			t.Fatalf("%s %q ?%q: %d %s", method, r.URL.Path, query, code, rec.Body)
		}
	})
}

// startFuzzApp runs a grid app in this process on a Redis of its own,
// with two workers' records and one session's, for the admin routes.
func startFuzzApp(tb testing.TB) {
	tb.Helper()
	rs := testenv.StartRedis(tb)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	app := &App{Redis: rs.URL(), DisableReaper: true, StaleThreshold: caddy.Duration(time.Hour)}
	if err := app.Provision(ctx); err != nil {
		tb.Fatal(err)
	}
	if err := app.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = app.Stop()
		_ = app.Cleanup()
		cancel()
	})
	reg := app.backend.reg
	bg := context.Background()
	for _, rec := range []registry.Record{
		{ID: "fz-1", Pool: "chromium", Browser: "chromium", Addr: "127.0.0.1:9", Path: "/playwright"},
		{ID: "fz-2", Pool: "chromium", Version: "1.65", Browser: "chromium", Addr: "127.0.0.1:9", Path: "/playwright"},
	} {
		if err := reg.Register(bg, registry.NewRecord(rec, 0, nil), registry.AgentState{Status: registry.Serving}, ""); err != nil {
			tb.Fatal(err)
		}
	}
	if _, _, err := reg.Claim(bg, registry.ClaimRequest{Group: "chromium", Policy: registry.LifetimeFirst, Session: "fz-session"}); err != nil {
		tb.Fatal(err)
	}
	app.addRoute([]string{"chromium"}, &claimer{app: app, policy: registry.LifetimeFirst})
}

// FuzzClientKey derives client keys from any header value, remote
// address, client IP and client_key template. The key is never empty and
// the same for the same request; a template naming a header gives that
// header's value, and a missing header falls back to the client's IP (an
// IPv6 client's /64, so another address of its network is the same
// client). What reaches Redis, the key's hash, is the same for the same
// key, differs for another, is 24 hex digits and never holds the key.
func FuzzClientKey(f *testing.F) {
	f.Add("{http.request.header.X-Client}", "alice", "192.0.2.1:5000", "192.0.2.1")
	f.Add("{http.request.header.X-Client}", "", "[2001:db8::1]:5000", "2001:db8:0:0:1234::1")
	f.Add(DefaultClientKey, "", "[2001:db8::1]:5000", "2001:db8::1%eth0")
	f.Add(DefaultClientKey, "x", "", "")
	f.Add("team-{http.request.header.X-Client}", "{http.vars.client_ip}", "10.0.0.1:1", "::ffff:10.0.0.1")
	f.Add("{http.request.header.X-Client", "bob", "unix", "")
	f.Fuzz(func(t *testing.T, tmpl, header, remote, ip string) {
		r := &http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/"}, Header: http.Header{}, RemoteAddr: remote}
		if header != "" {
			r.Header["X-Client"] = []string{header}
		}
		vars := map[string]any{}
		if ip != "" {
			vars[caddyhttp.ClientIPVarKey] = ip
		}
		r = r.WithContext(context.WithValue(context.Background(), caddyhttp.VarsCtxKey, vars))
		caddyhttp.NewTestReplacer(r)

		k := clientKey(r, tmpl)
		if k == "" {
			t.Fatal("an empty client key: every such client would share one budget")
		}
		if again := clientKey(r, tmpl); again != k {
			t.Fatalf("the key changed for the same request: %q, then %q", k, again)
		}
		if tmpl == "{http.request.header.X-Client}" && header != "" && k != header {
			t.Fatalf("the key is %q, want the header's value %q", k, header)
		}
		if tmpl == "{http.request.header.X-Client}" && header == "" && ip != "" && k != ipClient(ip) {
			t.Fatalf("without the header the key is %q, want the client's IP %q", k, ipClient(ip))
		}
		if tmpl == DefaultClientKey && ipClient(k) != k {
			t.Fatalf("the IP key %q is not its own client (%q)", k, ipClient(k))
		}
		if a, err := netip.ParseAddr(ip); err == nil && a.Is6() && !a.Is4In6() {
			p, err := netip.ParsePrefix(ipClient(ip))
			if err != nil || p.Bits() != ipv6ClientBits || !p.Contains(a.WithZone("")) {
				t.Fatalf("IPv6 %s names the client %q, want its /64", ip, ipClient(ip))
			}
			b := a.WithZone("").As16()
			b[15] ^= 0xff
			if other := netip.AddrFrom16(b); ipClient(other.String()) != ipClient(ip) {
				t.Fatalf("%s and %s, one /64, are two clients", ip, other)
			}
		}

		hash := clientHash(k)
		if len(hash) != 24 || strings.Trim(hash, "0123456789abcdef") != "" {
			t.Fatalf("hash %q is not 24 lowercase hex digits", hash)
		}
		if _, err := hex.DecodeString(hash); err != nil || hash == k || (len(k) >= 8 && strings.Contains(hash, k)) {
			t.Fatalf("hash %q holds the key %q", hash, k)
		}
		if clientHash(k) != hash {
			t.Fatal("the hash changed for the same key")
		}
		if clientHash(k+"\x00") == hash || clientHash(header+"|"+k) == hash {
			t.Fatal("two keys share a hash")
		}
	})
}

// nodeQueryGet is URLSearchParams.get as Node reads a query: pairs split
// on '&' only, '+' a space, a %-escape that does not parse kept as it is.
func nodeQueryGet(raw, key string) string {
	for _, pair := range strings.Split(raw, "&") {
		k, v, _ := strings.Cut(pair, "=")
		if nodeUnescape(k) == key {
			return nodeUnescape(v)
		}
	}
	return ""
}

func nodeUnescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '+':
			b.WriteByte(' ')
		case s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			x, _ := hex.DecodeString(s[i+1 : i+3])
			b.Write(x)
			i += 2
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
