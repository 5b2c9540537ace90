package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
