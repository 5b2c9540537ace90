package registry

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// maxMechanisms is the budget of registry mechanisms (docs/design.md).
const maxMechanisms = 12

// TestMechanismsTableMatchesKeySchema keeps docs/design.md's list of
// mechanisms true: every key and channel the registry names in keys.go is
// in the table, every key the table names is one the registry uses, and
// the table stays within the budget.
func TestMechanismsTableMatchesKeySchema(t *testing.T) {
	raw, err := os.ReadFile("../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Mechanisms\n")
	if !ok {
		t.Fatal("docs/design.md has no Mechanisms section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	rows := 0
	documented := map[string]bool{}
	// A key or channel is written `<pool>:name`, `<group>:name`,
	// `<group>:agent:<id>`, `{grid}:name`, or a group's further
	// `idx:...` name in the same row.
	named := regexp.MustCompile("`(?:<pool>|<group>|\\{grid\\}):([a-z_:]+?)(?::<id>)?`|`(idx:[a-z_]+)`")
	for _, line := range strings.Split(section, "\n") {
		f := strings.Split(line, "|")
		if len(f) < 4 {
			continue
		}
		if _, err := strconv.Atoi(strings.TrimSpace(f[1])); err != nil {
			continue // the header and its rule
		}
		rows++
		for _, m := range named.FindAllStringSubmatch(line, -1) {
			documented[m[1]+m[2]] = true
		}
	}
	if rows == 0 || rows > maxMechanisms {
		t.Errorf("the table lists %d mechanisms, want 1-%d", rows, maxMechanisms)
	}

	fs := token.NewFileSet()
	f, err := parser.ParseFile(fs, "keys.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	schema := map[string]string{} // value -> constant
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			v := s.(*ast.ValueSpec)
			for i, n := range v.Names {
				if !strings.HasPrefix(n.Name, "key") && !strings.HasPrefix(n.Name, "chan") {
					continue
				}
				lit, ok := v.Values[i].(*ast.BasicLit)
				if !ok {
					continue
				}
				val, _ := strconv.Unquote(lit.Value)
				schema[val] = n.Name
			}
		}
	}
	if len(schema) == 0 {
		t.Fatal("found no key constants in keys.go")
	}
	for val, name := range schema {
		if !documented[val] {
			t.Errorf("keys.go's %s (%q) is in no row of docs/design.md's Mechanisms table", name, val)
		}
	}
	var extra []string
	for val := range documented {
		if _, ok := schema[val]; !ok {
			extra = append(extra, val)
		}
	}
	slices.Sort(extra)
	for _, val := range extra {
		t.Errorf("docs/design.md's Mechanisms table names %q, which keys.go does not define", val)
	}
}
