package registry

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestLaunchOptionsAreReadAsPlaywrightsServerReadsThem: what the grid
// checks is what Playwright's server would apply. A query Go would read
// apart from Node (a ';' or a bad escape hides a pair from Go, not from
// Node) is refused, so are launch options that are no JSON object
// (null stops Playwright's server), and repeated headers count joined,
// as Node joins them.
func TestLaunchOptionsAreReadAsPlaywrightsServerReadsThem(t *testing.T) {
	req := func(query string, h ...string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/playwright/chromium", nil)
		r.URL.RawQuery = query
		for i := 0; i+1 < len(h); i += 2 {
			r.Header.Add(h[i], h[i+1])
		}
		return r
	}
	for _, tc := range []struct {
		name string
		r    *http.Request
		err  string
	}{
		{"a ';' in the query", req(`launch-options=%7B%22executablePath%22%3A%22%2Fbin%2Fsh%22%2C%22x%22%3A%22;%22%7D`), "query does not parse"},
		{"a bad escape in the query", req(`a=%zz&launch-options=%7B%7D`), "query does not parse"},
		{"null launch options in the header", req("", "X-Playwright-Launch-Options", "null"), "not a JSON object"},
		{"null launch options in the query", req("launch-options=null"), "not a JSON object"},
		{"two launch options headers", req("", "X-Playwright-Launch-Options", `{"slowMo":1}`, "X-Playwright-Launch-Options", `{"slowMo":2}`), "not a JSON object"},
	} {
		if _, err := ReadLaunchRequest(tc.r); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.err)
		}
	}
	lr, err := ReadLaunchRequest(req("", "X-Playwright-Proxy", "localhost", "X-Playwright-Proxy", "*"))
	if err != nil || lr.ExposeNetwork != "localhost, *" {
		t.Errorf("two exposeNetwork headers: %q (%v), want them joined as Node joins them", lr.ExposeNetwork, err)
	}
	lr, err = ReadLaunchRequest(req(`launch-options=%7B%22args%22%3A%5B%22--lang%3Dde%22%5D%2C%22slowMo%22%3A5%7D`))
	if err != nil || len(lr.Ignored) != 0 || len(lr.Args) != 1 || lr.Args[0] != "--lang=de" || string(lr.Options["slowMo"]) != "5" {
		t.Errorf("args and slowMo in the query: %+v (%v), want both read", lr, err)
	}
}

// TestArgsAreFlagsAndNothingElse: a client's args are read as Chromium
// flags, --name or --name=value, or refused with the one that is not; an
// operator can allow only flags that act on the browser alone.
func TestArgsAreFlagsAndNothingElse(t *testing.T) {
	read := func(args string) (LaunchRequest, error) {
		r := httptest.NewRequest(http.MethodGet, "/playwright/chromium", nil)
		r.Header.Set("X-Playwright-Launch-Options", `{"args":`+args+`}`)
		return ReadLaunchRequest(r)
	}
	for _, tc := range []struct{ args, err string }{
		{`"--lang=de"`, "not a list of strings"},
		{`[1]`, "not a list of strings"},
		{`["-no-sandbox"]`, `"-no-sandbox", which is no --flag`},
		{`["--Lang=de"]`, "which is no --flag"},
		{`["https://example.com/"]`, "which is no --flag"},
		{`["--"]`, "which is no --flag"},
		{`["--lang=de\u0000x"]`, "which is no --flag"},
		{`[` + strings.Repeat(`"--a",`, 32) + `"--a"]`, "33 flags, more than 32"},
		// values that stop Chromium as it starts
		{`["--window-size=bogus"]`, "--window-size takes WIDTH,HEIGHT"},
		{`["--window-size"]`, "--window-size takes WIDTH,HEIGHT"},
		{`["--autoplay-policy=x"]`, "--autoplay-policy takes no-user-gesture-required"},
		{`["--font-render-hinting=bogus"]`, "--font-render-hinting takes none"},
	} {
		if _, err := read(tc.args); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("args %s: %v, want an error saying %q", tc.args, err, tc.err)
		}
	}
	lr, err := read(`["--accept-lang=de", "--window-size=800,600", "--user-agent=a b=c"]`)
	if err != nil || strings.Join(lr.Args, " ") != "--accept-lang=de --window-size=800,600 --user-agent=a b=c" {
		t.Errorf("well-formed args: %q (%v)", lr.Args, err)
	}
	if ArgName("--user-agent=a b=c") != "--user-agent" || ArgName("--mute-audio") != "--mute-audio" {
		t.Error("ArgName does not cut at the first '='")
	}
	if lr, err := read(`[]`); err != nil || len(lr.Args) != 0 {
		t.Errorf("empty args: %+v (%v), want none", lr, err)
	}
	for _, name := range []string{"--accept-lang", "--window-size", "--disable-web-security"} {
		if err := CheckArgName(name); err != nil {
			t.Errorf("CheckArgName(%s): %v", name, err)
		}
	}
	// flags that turn off the sandbox, run a program, write a file where
	// their value says, open a port, or are read by Debian's chromium
	// script
	for name, want := range map[string]string{"--no-sandbox": "not a flag the grid passes", "--renderer-cmd-prefix": "not a flag the grid passes",
		"--log-net-log": "not a flag the grid passes", "--remote-debugging-port": "not a flag the grid passes", "--debug": "not a flag the grid passes",
		"--enable-features": "not a flag the grid passes", "--lang": "not a flag the grid passes", "--lang=de": "no flag name", "lang": "no flag name"} {
		if err := CheckArgName(name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckArgName(%s): %v, want %q", name, err, want)
		}
	}
}

// TestTheClaimCarriesTheFlagsCaddyChecked: the flags ride in the signed
// claim as Caddy read them, whatever they hold, and a claim whose flags
// were changed on the way does not verify.
func TestTheClaimCarriesTheFlagsCaddyChecked(t *testing.T) {
	secret := []byte("k")
	tk := Ticket{Session: "s1", Group: "chromium@1.65", Worker: "w-1", Args: []string{"--user-agent=a 'b' $(c); d=e", "--window-size=8,6"}}.Signed(secret)
	got, err := ParseTicket(tk.String(), secret)
	if err != nil || strings.Join(got.Args, "|") != strings.Join(tk.Args, "|") {
		t.Fatalf("read back %q (%v), want %q", got.Args, err, tk.Args)
	}
	other := tk
	other.Args = []string{"--window-size=8,6"}
	forged := strings.Replace(tk.String(), "args="+tk.argsField(), "args="+other.argsField(), 1)
	if _, err := ParseTicket(forged, secret); err == nil || !strings.Contains(err.Error(), "signature") {
		t.Fatalf("a claim with other flags: %v, want its signature refused", err)
	}
	if plain, err := ParseTicket(Ticket{Session: "s1", Group: "g", Worker: "w"}.Signed(nil).String(), nil); err != nil || plain.Args != nil {
		t.Fatalf("a claim without flags: %+v (%v)", plain, err)
	}
	// a claim without flags is signed as one of a build before flags was
	noFlags := Ticket{Session: "s1", Group: "g", Worker: "w", Issued: time.UnixMilli(1)}.Signed(secret)
	if noFlags.Sig != Sign(secret, ticketLabel, strconv.Itoa(Protocol), "s1", "g", "w", "-", "0", "0", "0", "0", "1") {
		t.Error("a claim without flags signs more than its ten fields")
	}
	// one form of the flags only: not the same list in other JSON
	spaced := strings.Replace(tk.String(), "args="+tk.argsField(), "args="+base64.RawURLEncoding.EncodeToString([]byte(`[ "--window-size=8,6" ]`)), 1)
	if _, err := ParseTicket(spaced, nil); err == nil || !strings.Contains(err.Error(), "as Caddy writes it") {
		t.Errorf("flags in other JSON: %v, want them refused", err)
	}
}
