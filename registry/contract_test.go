package registry

import (
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// namesIn returns the distinct names matched by re's first group in src.
func namesIn(re *regexp.Regexp, src string) []string {
	seen := map[string]bool{}
	for _, m := range re.FindAllStringSubmatch(src, -1) {
		seen[m[1]] = true
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// replyFields returns the field names of the script's `return reply { … }`.
func replyFields(t *testing.T, src string) []string {
	t.Helper()
	i := strings.LastIndex(src, "return reply {")
	if i < 0 {
		t.Fatal("no `return reply {` in the script")
	}
	j := strings.Index(src[i:], "\n}")
	return namesIn(regexp.MustCompile(`(?m)(?:^|[{,\s])([a-z_]+) =`), src[i+len("return reply {"):i+j])
}

// The Lua reads its arguments and builds its replies only by the names
// contract.go lists, and uses every one of them: a field added, removed or
// moved on one side only fails here (a reply field the Lua does not set is
// also a script error at run time, never a shifted reply).
func TestContractNamesMatchTheLua(t *testing.T) {
	var walks strings.Builder
	for _, p := range policies {
		walks.WriteString(p.walk)
	}
	cases := []struct {
		name  string
		src   string
		args  []string
		reply []string
	}{
		{"claim.lua", luaClaim + luaWalk + walks.String(), claimArgs, claimReply},
		{"read.lua", luaRead, readArgs, readReply},
	}
	positional := regexp.MustCompile(`ARGV\[(\d+)\]`)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code := stripLuaComments(c.src)
			for _, m := range positional.FindAllStringSubmatch(code, -1) {
				if m[1] != "1" { // ARGV[1], now, is every script's (common.lua)
					t.Errorf("%s reads %s by position: read it as ARGV[REQ.<name>]", c.name, m[0])
				}
			}
			used := namesIn(regexp.MustCompile(`REQ\.([a-z_]+)`), code)
			want := slices.Clone(c.args)
			sort.Strings(want)
			if !slices.Equal(used, want) {
				t.Errorf("%s reads arguments %v; contract.go names %v", c.name, used, want)
			}
			got := replyFields(t, code)
			wantReply := slices.Clone(c.reply)
			sort.Strings(wantReply)
			if !slices.Equal(got, wantReply) {
				t.Errorf("%s replies %v; contract.go names %v", c.name, got, wantReply)
			}
		})
	}
}

func stripLuaComments(src string) string {
	var b strings.Builder
	for _, line := range strings.Split(src, "\n") {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String()
}

// read.lua's rows carry readRow's fields, all of them.
func TestContractReadRow(t *testing.T) {
	code := stripLuaComments(luaRead)
	i := strings.Index(code, "add_row(rows, {")
	if i < 0 {
		t.Fatal("read.lua builds no row with add_row")
	}
	j := strings.Index(code[i:], "})")
	got := namesIn(regexp.MustCompile(`(?m)(?:^|[{,\s])([a-z_]+) =`), code[i+len("add_row(rows, {"):i+j])
	want := slices.Clone(readRow)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Fatalf("read.lua's rows have %v; contract.go names %v", got, want)
	}
}

// Every row of the policy table has its walk, which defines the row's
// WALKS entry and no other, and walk.lua has the place the walks go.
func TestPolicyTableWalks(t *testing.T) {
	if !strings.Contains(luaWalk, walksMark) {
		t.Fatalf("walk.lua has no %q line", strings.TrimSpace(walksMark))
	}
	def := regexp.MustCompile(`WALKS\.([a-z_0-9]+) = function`)
	seen := map[Policy]bool{}
	for _, p := range Policies() {
		if seen[p.Name] {
			t.Errorf("policy %s twice in the table", p.Name)
		}
		seen[p.Name] = true
		got := namesIn(def, p.walk)
		if !slices.Equal(got, []string{string(p.Name)}) {
			t.Errorf("policy %s: its walk defines %v, want WALKS.%s", p.Name, got, p.Name)
		}
		if got, ok := LookupPolicy(string(p.Name)); !ok || got.Name != p.Name {
			t.Errorf("LookupPolicy(%q) = %v, %v", p.Name, got.Name, ok)
		}
	}
	if _, ok := LookupPolicy("round_robin"); ok {
		t.Error("LookupPolicy found a policy the table does not have")
	}
}

// An argument left unset is an error in Go, before Redis sees a shifted
// ARGV.
func TestContractArgvUnset(t *testing.T) {
	_, err := newArgv(readArgsLayout).set("id", "").set("cursor", "0").list()
	if err == nil || !strings.Contains(err.Error(), "chunk") {
		t.Fatalf("list with chunk unset: %v, want an error naming chunk", err)
	}
}

// contractBody turns names into positions when the library is built: the
// reply in the contract's order whatever the source's, comments and
// nested brackets kept apart, the source's line count kept, and any name
// the contract does not have (or a field missing or set twice) refused.
func TestContractBodyCompiles(t *testing.T) {
	args, rep := []string{"a", "b"}, []string{"x", "y", "z"}
	src := "local v = ARGV[REQ.b]\nreturn reply {\n  z = f(1, {2, 3}), -- a comment, with a comma\n  x = 'a,}', y = ARGV[REQ.a],\n}\nlocal after = 1\n"
	got := contractBody("t.lua", args, rep, src)
	if !strings.Contains(got, "local v = ARGV[5]\n") || !strings.Contains(got, "return {('a,}'), (ARGV[4]), (f(1, {2, 3}))}") {
		t.Fatalf("compiled:\n%s", got)
	}
	if strings.Count(got, "\n") != strings.Count(src, "\n") || !strings.HasSuffix(got, "\nlocal after = 1\n") {
		t.Fatalf("line count %d, source's %d:\n%s", strings.Count(got, "\n"), strings.Count(src, "\n"), got)
	}
	for name, bad := range map[string]string{
		"unknown argument": "return ARGV[REQ.c]",
		"missing field":    "return reply { x = 1, y = 2 }",
		"unknown field":    "return reply { x = 1, y = 2, z = 3, w = 4 }",
		"field twice":      "return reply { x = 1, y = 2, z = 3, x = 4 }",
		"not closed":       "return reply { x = 1, y = 2, z = 3",
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: %q compiled", name, bad)
				}
			}()
			contractBody("t.lua", args, rep, bad)
		}()
	}
}
