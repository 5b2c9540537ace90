package main

import (
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestTargetsUnknownPart: a part name -redis-parts does not know (a typo,
// or "pinned" for caddy-pinned) is an error naming it, not a run that
// measures nothing and prints an empty table.
func TestTargetsUnknownPart(t *testing.T) {
	old := *tgtParts
	t.Cleanup(func() { _ = flag.Set("redis-parts", old) })
	if err := flag.Set("redis-parts", "pinned"); err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	err = runTargets(&config{quick: true, out: out})
	if err == nil || !strings.Contains(err.Error(), `"pinned"`) {
		t.Fatalf("runTargets with -redis-parts pinned: %v, want an error naming \"pinned\"", err)
	}
}

// TestTargetsPprofPinned: with -redis-pprof the caddy and caddy-pinned
// parts (both in the default run) each profile bin/caddy; the pinned
// profiles go beside the shared ones instead of overwriting them.
func TestTargetsPprofPinned(t *testing.T) {
	if testing.Short() {
		t.Skip("runs redis-server and bin/caddy; not in -short")
	}
	testenv.LookPath(t, "redis-server")
	t.Setenv("GRIDBENCH_CADDY", testenv.Bin(t, "caddy"))
	dir := t.TempDir()
	prof := filepath.Join(dir, "caddy.pprof")
	for name, v := range map[string]string{"redis-parts": "caddy,caddy-pinned", "redis-pprof": prof, "redis-pprof-for": "200ms"} {
		old := flag.Lookup(name).Value.String()
		t.Cleanup(func() { _ = flag.Set(name, old) })
		if err := flag.Set(name, v); err != nil {
			t.Fatal(err)
		}
	}
	out, err := os.Create(filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if err := runTargets(&config{quick: true, out: out}); err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	// on one CPU the pinned part says why it is skipped, and only the
	// shared part profiles
	want := 4
	if runtime.NumCPU() < 2 {
		want = 2
		if !strings.Contains(string(text), "caddy-pinned skipped") {
			t.Fatalf("caddy-pinned on one CPU printed no reason:\n%s", text)
		}
	} else if !strings.Contains(string(text), "Redis alone on CPU") {
		t.Fatalf("caddy-pinned did not run:\n%s", text)
	}
	written := map[string]string{} // file: the line that named it
	for _, line := range strings.Split(string(text), "\n") {
		if !strings.HasPrefix(line, "CPU profile of bin/caddy") {
			continue
		}
		if prev, ok := written[profPath(line)]; ok {
			t.Errorf("two profiles written to %s:\n%s\n%s", profPath(line), prev, line)
		}
		written[profPath(line)] = line
	}
	if len(written) != want {
		t.Errorf("%d profile files, want %d (grid and stock, shared and, with 2 CPUs, pinned):\n%s", len(written), want, text)
	}
}

// profPath is the file a "CPU profile of bin/caddy" line names.
func profPath(line string) string {
	_, rest, _ := strings.Cut(line, "sessions; ")
	path, _, _ := strings.Cut(rest, " (")
	return path
}
