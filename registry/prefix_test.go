package registry

import (
	"strings"
	"testing"
)

func TestCheckPrefix(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		bad    string // the character the error must name; "" means valid
	}{
		{"", ""},
		{"grid", ""},
		{"prod-grid_2.eu", ""},
		{"gr}id", "'}'"},
		{"{grid", "'{'"},
		{"a:b", "':'"},
		{"a b", "' '"},
		{"a\tb", `'\t'`},
		{strings.Repeat("g", 65), "65 bytes"},
	} {
		t.Run(tc.prefix, func(t *testing.T) {
			err := CheckPrefix(tc.prefix)
			switch {
			case tc.bad == "" && err != nil:
				t.Errorf("CheckPrefix(%q) = %v, want nil", tc.prefix, err)
			case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
				t.Errorf("CheckPrefix(%q) = %v, want an error naming %s", tc.prefix, err, tc.bad)
			}
		})
	}
}
