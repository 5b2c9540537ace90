package caddygrid

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// An operator finds every Caddyfile option the grid parses (the
// browser_grid directive and its policies, lb_policy blocks, the grid
// global option, the transport, the upstream source, browser_grid_ui) as
// a row of docs/configuration.md's tables, starting "| `<option>". The
// options are read from the parsers themselves: the cases of every
// switch over an option's name in a function that takes a Caddyfile
// dispenser.
func TestDocsListEveryCaddyfileOption(t *testing.T) {
	opts := caddyfileOptions(t)
	// The parsers must have been found: a rename must not make this test
	// pass on an empty list.
	for _, known := range []string{"max_concurrent", "policy", "samples", "redis", "stale_threshold", "dial_timeout", "browsers", "interval"} {
		if !slices.Contains(opts, known) {
			t.Fatalf("the parsers' options %v lack %q: the collector no longer finds them", opts, known)
		}
	}
	doc := readDoc(t, "configuration.md")
	var missing []string
	for _, opt := range opts {
		row := regexp.MustCompile("(?m)^\\| `" + regexp.QuoteMeta(opt) + "[ `]")
		if !row.MatchString(doc) {
			missing = append(missing, opt)
		}
	}
	if len(missing) > 0 {
		t.Errorf("docs/configuration.md has no table row \"| `<option>\" for %d of the %d options the Caddyfile parsers take: %s",
			len(missing), len(opts), strings.Join(missing, ", "))
	}
}

// An operator finds every metric the grid registers on Caddy's /metrics
// named in docs/operations.md or docs/configuration.md.
func TestDocsNameEveryMetric(t *testing.T) {
	var reg collectors
	if err := registerMetrics(&reg); err != nil {
		t.Fatal(err)
	}
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	var names []string
	for _, c := range reg {
		ch := make(chan *prometheus.Desc, 16)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			if m := fq.FindStringSubmatch(d.String()); m != nil {
				names = append(names, m[1])
			}
		}
	}
	if len(names) < 10 {
		t.Fatalf("found only the metrics %v: registerMetrics no longer registers them all here", names)
	}
	docs := readDoc(t, "operations.md") + readDoc(t, "configuration.md")
	var missing []string
	for _, n := range names {
		if !regexp.MustCompile(regexp.QuoteMeta(n) + `([^a-z_]|$)`).MatchString(docs) {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		t.Errorf("docs/operations.md and docs/configuration.md do not name %d of the %d metrics: %s",
			len(missing), len(names), strings.Join(missing, ", "))
	}
}

// collectors is a prometheus.Registerer that keeps what it is given.
type collectors []prometheus.Collector

func (c *collectors) Register(x prometheus.Collector) error   { *c = append(*c, x); return nil }
func (c *collectors) MustRegister(xs ...prometheus.Collector) { *c = append(*c, xs...) }
func (c *collectors) Unregister(prometheus.Collector) bool    { return false }

func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// caddyfileOptions reads the package's Caddyfile parsers (the functions
// that take a *caddyfile.Dispenser) and returns the string cases of their
// switches over the option's name: a switch on a variable called name, or
// on d.Val() unless inside one of those (there it switches over a value,
// as stagger_drains' on and off).
func caddyfileOptions(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil || !takesDispenser(fn) {
				continue
			}
			collectCases(fn.Body, false, seen)
		}
	}
	out := make([]string, 0, len(seen))
	for o := range seen {
		out = append(out, o)
	}
	slices.Sort(out)
	return out
}

func takesDispenser(fn *ast.FuncDecl) bool {
	for _, p := range fn.Type.Params.List {
		if star, ok := p.Type.(*ast.StarExpr); ok {
			if sel, ok := star.X.(*ast.SelectorExpr); ok && sel.Sel.Name == "Dispenser" {
				return true
			}
		}
	}
	return false
}

// collectCases adds the cases of the option switches under n; inOption
// says n is inside one already.
func collectCases(n ast.Node, inOption bool, seen map[string]bool) {
	ast.Inspect(n, func(x ast.Node) bool {
		sw, ok := x.(*ast.SwitchStmt)
		if !ok || x == n {
			return true
		}
		byName, byVal := false, false
		switch tag := sw.Tag.(type) {
		case *ast.Ident:
			byName = tag.Name == "name"
		case *ast.CallExpr:
			if sel, ok := tag.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Val" {
				byVal = true
			}
		}
		option := byName || (byVal && !inOption)
		if option {
			for _, stmt := range sw.Body.List {
				for _, e := range stmt.(*ast.CaseClause).List {
					if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						if s, err := strconv.Unquote(lit.Value); err == nil {
							seen[s] = true
						}
					}
				}
			}
		}
		for _, stmt := range sw.Body.List {
			collectCases(stmt, inOption || option, seen)
		}
		return false
	})
}
