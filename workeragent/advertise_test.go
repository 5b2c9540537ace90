package workeragent

import (
	"net"
	"testing"
)

// TestSplitAdvertise: -advertise values an operator may type, and what is
// registered from them (the browser's port 3131 for a bare host). What
// Caddy's dial policy would never dial is refused with exit 2 (Validate),
// rather than registered and refused at every claim.
func TestSplitAdvertise(t *testing.T) {
	for _, tc := range []struct{ adv, want string }{
		{"10.0.0.7", "10.0.0.7:3131"},
		{"10.0.0.7:9000", "10.0.0.7:9000"},
		{"worker-1.example", "worker-1.example:3131"},
		{"bücher.example:9000", "bücher.example:9000"},
		{"::1", "[::1]:3131"},
		{"[::1]", "[::1]:3131"},
		{"[::1]:9000", "[::1]:9000"},
		{"::ffff:10.0.0.7", "[::ffff:10.0.0.7]:3131"},
		{"[::ffff:10.0.0.7]", "[::ffff:10.0.0.7]:3131"},
		// refused
		{"10.0.0.7:", ""},
		{"[::1]:", ""},
		{"10.0.0.7:+9000", ""},
		{"10.0.0.7:0", ""},
		{"10.0.0.7::9000", ""},
		{"10.0.0.7:9000:", ""},
		{"1.2.3.4:5:6", ""},
		{"fe80::1%eth0", ""},
		{"[fe80::1%eth0]:9000", ""},
		{"host%eth0:9000", ""},
		{"{x}:9000", ""},
		{"host\t:9000", ""},
		{"10.0.0.\xff:9000", ""},
		{"http://x", ""},
		{"user@host:9000", ""},
		{"[10.0.0.7]", ""},
	} {
		got := ""
		h, p, err := splitAdvertise(tc.adv)
		if err == nil {
			if p == "" {
				p = "3131"
			}
			got = net.JoinHostPort(h, p)
		}
		if got != tc.want {
			t.Errorf("-advertise %q registers %q (err %v), want %q", tc.adv, got, err, tc.want)
		}
		c := Defaults()
		c.Advertise = tc.adv
		if verr := c.Validate(); (verr == nil) != (tc.want != "") {
			t.Errorf("-advertise %q: Validate says %v, want refused: %v", tc.adv, verr, tc.want == "")
		}
	}
}
