package caddygrid

import (
	"net/http/httptest"
	"testing"
)

func TestClientVersion(t *testing.T) {
	for _, tc := range []struct{ ua, want string }{
		// What playwright-core's connect() sends (seen on the wire).
		{"Playwright/1.65.1 (x64; debian 12) node/20.20", "1.65"},
		{"Playwright/1.64.1 (x64; debian 12) node/20.20", "1.64"},
		{"Playwright/1.63.0 (arm64; darwin 23.1) node/22.1", "1.63"},
		{"Playwright/1.66.0-alpha-2026-11-01 (x64; ubuntu 24.04) node/22.0", "1.66"},
		{"Playwright/01.065.1", "1.65"},
		{"", ""},
		{"Mozilla/5.0 Playwright/1.65.1", ""},
		{"Playwright/1", ""},
		{"Playwright/1.65x", ""},
		{"Playwright/12345.1.0", ""},
	} {
		r := httptest.NewRequest("GET", "/playwright/chromium", nil)
		if tc.ua != "" {
			r.Header.Set("User-Agent", tc.ua)
		}
		if got := clientVersion(r); got != tc.want {
			t.Errorf("clientVersion(%q) = %q, want %q", tc.ua, got, tc.want)
		}
	}
}
