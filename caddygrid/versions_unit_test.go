package caddygrid

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"
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

func TestRenderStatusShowsVersions(t *testing.T) {
	out := renderStatus([]PoolDetail{{
		PoolSummary: PoolSummary{Pool: "chromium", Versions: []string{"1.64", "1.65"}},
		WorkerStatuses: []WorkerStatus{
			{ID: "a", Status: "available", Lifetime: 2, PlaywrightVersion: "1.64"},
			{ID: "b", Status: "available", Lifetime: 1, PlaywrightVersion: "1.65"},
			{ID: "cdp", Status: "available"},
		},
	}}, time.Now())
	lines := strings.Split(out, "\n")
	if !strings.HasSuffix(lines[0], ", Playwright 1.64, 1.65") {
		t.Errorf("pool line %q does not end with its versions", lines[0])
	}
	for _, want := range []string{"a  ", "b  ", "cdp"} {
		for _, l := range lines[2:] {
			if strings.HasPrefix(strings.TrimSpace(l), want) {
				v := map[string]string{"a  ": "Playwright 1.64", "b  ": "Playwright 1.65"}[want]
				if v != "" && !strings.HasSuffix(l, v) || v == "" && strings.Contains(l, "Playwright") {
					t.Errorf("worker line %q: want version %q", l, v)
				}
			}
		}
	}
}
