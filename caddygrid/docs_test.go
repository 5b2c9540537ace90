package caddygrid

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// The checks below keep the reference pages in step with the code: every
// Caddyfile option a parser accepts is in its page's option table and
// every option a table lists is accepted; every metric the grid registers
// is in configuration.md's metrics table, with its type and labels, and
// the table names no other.

// caseOptions returns the string literals of the case clauses in the
// named functions of the package's files: the option names a Caddyfile
// parser switches on. A function is "Recv.Name" for a method, "Name"
// otherwise; "*.unmarshalOwn" takes that method of every type.
func caseOptions(t *testing.T, funcs ...string) []string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, f := range funcs {
		want[f] = true
	}
	found := map[string]bool{}
	set := map[string]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			key := fn.Name.Name
			if fn.Recv != nil && len(fn.Recv.List) == 1 {
				typ := fn.Recv.List[0].Type
				if st, ok := typ.(*ast.StarExpr); ok {
					typ = st.X
				}
				if want["*."+key] {
					key = "*." + key
				} else {
					key = fmt.Sprint(typ) + "." + key
				}
			}
			if !want[key] {
				continue
			}
			found[key] = true
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				cc, ok := n.(*ast.CaseClause)
				if !ok {
					return true
				}
				for _, e := range cc.List {
					if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, _ := strconv.Unquote(lit.Value)
						if v != "on" && v != "off" { // values of stagger_drains and version_routing
							set[v] = true
						}
					}
				}
				return true
			})
		}
	}
	for _, f := range funcs {
		if !found[f] {
			t.Fatalf("no function %s in package caddygrid: update this test", f)
		}
	}
	var out []string
	for v := range set {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// docSection returns the lines of page from the heading that starts with
// heading up to the next heading.
func docSection(t *testing.T, page, heading string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "docs", page))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	in := false
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, heading) {
			in = true
			continue
		}
		if in && strings.HasPrefix(line, "#") {
			break
		}
		if in {
			out = append(out, line)
		}
	}
	if len(out) == 0 {
		t.Fatalf("docs/%s has no section %q", page, heading)
	}
	return out
}

var (
	codeSpan   = regexp.MustCompile("`([^`]*)`")
	placeArg   = regexp.MustCompile(`<[^>]*>|\[[^\]]*\]`)
	optionWord = regexp.MustCompile(`[a-z][a-z0-9_]*`)
)

// tableOptions returns the option names of the first column of the
// section's tables: every word in its code spans, leaving out arguments
// (<n>, [on|off]).
func tableOptions(lines []string) []string {
	set := map[string]bool{}
	for _, line := range lines {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.ReplaceAll(line, `\|`, "/"), "|")
		for _, m := range codeSpan.FindAllStringSubmatch(cells[1], -1) {
			for _, w := range optionWord.FindAllString(placeArg.ReplaceAllString(m[1], ""), -1) {
				set[w] = true
			}
		}
	}
	var out []string
	for w := range set {
		out = append(out, w)
	}
	sort.Strings(out)
	return out
}

func TestDocsListEveryCaddyfileOption(t *testing.T) {
	policies := map[string]bool{}
	for _, p := range registry.Policies() {
		policies[string(p.Name)] = true
	}
	for _, c := range []struct {
		what, page, heading string
		funcs               []string
	}{
		{"the browser_grid directive", "configuration.md", "## `browser_grid",
			[]string{"Handler.UnmarshalCaddyfile", "unmarshalClaimOption", "*.unmarshalOwn", "UpstreamSource.UnmarshalCaddyfile"}},
		{"the grid global option", "configuration.md", "## The global option `grid`",
			[]string{"App.UnmarshalCaddyfile", "App.unmarshalDialOption"}},
		{"the browser_grid_ui directive", "grid-ui.md", "# The grid page",
			[]string{"UIHandler.UnmarshalCaddyfile"}},
	} {
		parsed := caseOptions(t, c.funcs...)
		documented := tableOptions(docSection(t, c.page, c.heading))
		for _, o := range parsed {
			if !slices.Contains(documented, o) {
				t.Errorf("%s accepts %q, but the option table of docs/%s (%s) does not list it", c.what, o, c.page, c.heading)
			}
		}
		for _, o := range documented {
			if !slices.Contains(parsed, o) && !policies[o] && o != "on" && o != "off" {
				t.Errorf("docs/%s (%s) lists %q, which %s does not accept", c.page, c.heading, o, c.what)
			}
		}
	}
}

var descPattern = regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)

func TestDocsListEveryMetric(t *testing.T) {
	type metric struct{ kind, labels string }
	code := map[string]metric{}
	for _, c := range gridCollectors() {
		var kind string
		switch c.(type) {
		case *prometheus.CounterVec:
			kind = "counter"
		case *prometheus.GaugeVec:
			kind = "gauge"
		case *prometheus.HistogramVec:
			kind = "histogram"
		default:
			t.Fatalf("collector %T: teach this test its type", c)
		}
		ch := make(chan *prometheus.Desc, 4)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			m := descPattern.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read %s", d)
			}
			code[m[1]] = metric{kind, strings.ReplaceAll(m[2], ",", ", ")}
		}
	}
	documented := map[string]metric{}
	for _, line := range docSection(t, "configuration.md", "## Metrics") {
		cells := strings.Split(line, "|")
		if len(cells) < 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`caddy_grid_") {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		documented[name] = metric{strings.TrimSpace(cells[2]), strings.TrimSpace(cells[3])}
	}
	if len(documented) == 0 {
		t.Fatal("found no metrics table in docs/configuration.md: the table pattern no longer matches")
	}
	for name, m := range code {
		d, ok := documented[name]
		switch {
		case !ok:
			t.Errorf("metric %s (%s; %s) is not in docs/configuration.md's metrics table", name, m.kind, m.labels)
		case d != m:
			t.Errorf("docs/configuration.md says %s is a %s with labels %q; the code registers a %s with %q", name, d.kind, d.labels, m.kind, m.labels)
		}
	}
	for name := range documented {
		if _, ok := code[name]; !ok {
			t.Errorf("docs/configuration.md lists metric %s, which the grid does not register", name)
		}
	}
}
