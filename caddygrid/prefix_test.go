package caddygrid_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBadPrefixRefused: a key prefix with a brace would break the Redis
// Cluster hash tag of every key; Caddy refuses it when adapting a
// Caddyfile (naming the file and line) and when loading a JSON config
// (caught in the grid app's Validate), naming the bad character.
func TestBadPrefixRefused(t *testing.T) {
	dir := t.TempDir()
	caddyfile := filepath.Join(dir, "Caddyfile")
	src := "{\n\tgrid {\n\t\tprefix gr}id\n\t}\n}\n\n:8080 {\n\tbrowser_grid chromium\n}\n"
	if err := os.WriteFile(caddyfile, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(caddyBin(t), "adapt", "--config", caddyfile, "--adapter", "caddyfile").CombinedOutput()
	if err == nil {
		t.Fatalf("caddy adapt accepted prefix gr}id:\n%s", out)
	}
	for _, want := range []string{"Caddyfile:3", "'}'"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("caddy adapt's error does not name %s:\n%s", want, out)
		}
	}

	for _, prefix := range []string{"gr}id", "{grid"} {
		config := filepath.Join(dir, "caddy.json")
		js := `{"apps": {"grid": {"prefix": "` + prefix + `"}}}`
		if err := os.WriteFile(config, []byte(js), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(caddyBin(t), "validate", "--config", config).CombinedOutput()
		if err == nil {
			t.Fatalf("caddy validate accepted prefix %s:\n%s", prefix, out)
		}
		bad := "'" + strings.Trim(prefix, "grid") + "'"
		if !strings.Contains(string(out), "prefix") || !strings.Contains(string(out), bad) {
			t.Errorf("caddy validate's error does not name the prefix and %s:\n%s", bad, out)
		}
	}
}
