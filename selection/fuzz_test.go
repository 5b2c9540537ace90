package selection

import (
	"strings"
	"testing"
)

// FuzzParseMember: any string either parses into a member that formats
// back to the same text (up to hex case), or fails with an error; never a
// panic.
func FuzzParseMember(f *testing.F) {
	f.Add(Member(Positions("w1", 1)[0], "w1"))
	f.Add("00000000000000000000000000000000:a:b")
	f.Add("ZZ:w")
	f.Add(":")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		p, id, err := ParseMember(s)
		if err != nil {
			if !strings.Contains(err.Error(), "ring member") {
				t.Fatalf("error %q does not say what it parsed", err)
			}
			return
		}
		if id == "" {
			t.Fatal("parsed an empty id")
		}
		if got := Member(p, id); got != strings.ToLower(s[:32])+s[32:] {
			t.Fatalf("round trip %q -> %q", s, got)
		}
		q, err := ParsePos(p.String())
		if err != nil || q != p {
			t.Fatalf("ParsePos(%s) = %s, %v", p, q, err)
		}
	})
}
