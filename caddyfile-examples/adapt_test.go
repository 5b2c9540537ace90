// Package examples holds the runnable Caddyfiles of the grid. Each
// X.Caddyfile is also a golden adapt test: adapting it must give X.json
// exactly (go test -run TestExamples -update rewrites the goldens, to be
// reviewed like code). The harness follows caddy-l4's integration tests.
package examples

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/browsergrid/caddy-browser-grid/caddygrid"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite the golden .json files from the adapter's output")

func TestMain(m *testing.M) {
	// The examples read {$GRID_REDIS:default}; adapt them with the default.
	os.Unsetenv("GRID_REDIS")
	os.Exit(m.Run())
}

// adapt runs the Caddyfile adapter as 'caddy adapt' does, and indents the
// result the way the golden files are written.
func adapt(filename string, src []byte) ([]byte, []caddyconfig.Warning, error) {
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": filename})
	if err != nil {
		return nil, warnings, err
	}
	return indent(out), warnings, nil
}

func indent(b []byte) []byte {
	var buf bytes.Buffer
	if err := json.Indent(&buf, b, "", "\t"); err != nil {
		return b
	}
	buf.WriteByte('\n')
	return buf.Bytes()
}

func examples(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no *.Caddyfile in caddyfile-examples")
	}
	return files
}

func golden(caddyfile string) string { return strings.TrimSuffix(caddyfile, ".Caddyfile") + ".json" }

// TestExamplesAdapt adapts every example in-process and compares it with
// its golden JSON.
func TestExamplesAdapt(t *testing.T) {
	for _, f := range examples(t) {
		t.Run(f, func(t *testing.T) {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			got, warnings, err := adapt(f, src)
			if err != nil {
				t.Fatalf("adapting %s: %v", f, err)
			}
			for _, w := range warnings {
				t.Errorf("adapting %s: warning at line %d: %s", f, w.Line, w.Message)
			}
			if *update {
				if err := os.WriteFile(golden(f), got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden(f))
			if err != nil {
				t.Fatalf("reading golden file (create it with -update): %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("adapting %s does not give %s (rerun with -update if the change is intended):\n%s",
					f, golden(f), firstDiff(string(want), string(got)))
			}
		})
	}
}

// TestExamplesAdaptWithCaddyBinary runs the real 'caddy adapt' of
// bin/caddy on every example: what users run must give the goldens too.
func TestExamplesAdaptWithCaddyBinary(t *testing.T) {
	caddy := testenv.Bin(t, "caddy")
	for _, f := range examples(t) {
		t.Run(f, func(t *testing.T) {
			cmd := exec.Command(caddy, "adapt", "--config", f, "--adapter", "caddyfile")
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "GRID_REDIS=") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("caddy adapt %s: %v\n%s", f, err, stderr.String())
			}
			want, err := os.ReadFile(golden(f))
			if err != nil {
				t.Fatal(err)
			}
			if got := indent(bytes.TrimSpace(out)); !bytes.Equal(got, want) {
				t.Errorf("bin/caddy adapt %s does not give %s:\n%s", f, golden(f), firstDiff(string(want), string(got)))
			}
		})
	}
}

// firstDiff shows the first differing line with a little context.
func firstDiff(want, got string) string {
	wl, gl := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(wl) || i < len(gl); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			return fmt.Sprintf("line %d:\n  want: %s\n  got:  %s", i+1, w, g)
		}
	}
	return "(no line differs; whitespace at the end)"
}
