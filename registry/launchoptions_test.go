package registry

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
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
	if err != nil || len(lr.Ignored) != 1 || lr.Ignored[0] != "args" || string(lr.Options["slowMo"]) != "5" {
		t.Errorf("args and slowMo in the query: %+v (%v), want args refused and slowMo read", lr, err)
	}
}
