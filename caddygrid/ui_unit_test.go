package caddygrid

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// TestUICaddyfile: the directive's syntax, and a clear error naming what
// was wrong for bad input.
func TestUICaddyfile(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     UIHandler
		err      string
	}{
		{name: "bare", in: `browser_grid_ui`},
		{name: "both options", in: "browser_grid_ui {\n interval 5s\n max_workers 50\n}",
			want: UIHandler{Interval: caddy.Duration(5 * time.Second), MaxWorkers: 50}},
		{name: "argument", in: `browser_grid_ui chromium`, err: "wrong argument count"},
		{name: "bad interval", in: "browser_grid_ui {\n interval soon\n}", err: "invalid interval 'soon'"},
		{name: "zero interval", in: "browser_grid_ui {\n interval 0s\n}", err: "invalid interval '0s'"},
		{name: "bad max_workers", in: "browser_grid_ui {\n max_workers 0\n}", err: "invalid max_workers '0'"},
		{name: "repeated", in: "browser_grid_ui {\n interval 1s\n interval 2s\n}", err: "interval already specified"},
		{name: "trailing", in: "browser_grid_ui {\n interval 1s 2s\n}", err: "wrong argument count"},
		{name: "unknown", in: "browser_grid_ui {\n redis x\n}", err: "unrecognized subdirective 'redis'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h UIHandler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
			switch {
			case tc.err != "":
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
			case err != nil:
				t.Fatal(err)
			case h.Interval != tc.want.Interval || h.MaxWorkers != tc.want.MaxWorkers:
				t.Errorf("got %+v, want %+v", h, tc.want)
			}
		})
	}
	if err := (&UIHandler{Interval: caddy.Duration(100 * time.Millisecond)}).Validate(); err == nil || !strings.Contains(err.Error(), "below the minimum 500ms") {
		t.Errorf("an interval of 100ms validated with %v, want an error naming the minimum", err)
	}
}
