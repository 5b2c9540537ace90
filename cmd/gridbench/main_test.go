package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestQuickRun runs every section of the bench with small samples, so that
// 'make bench' cannot rot between the times someone runs it. The figures
// of a quick run mean nothing; what is checked is that each section runs
// against its real parts and prints its tables, and that every target is
// printed with a verdict.
func TestQuickRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs redis-server, bin/caddy and bin/grid-worker; not in -short")
	}
	testenv.LookPath(t, "redis-server")
	testenv.LookPath(t, "redis-benchmark")
	bin := testenv.Bin(t, "gridbench")
	testenv.Bin(t, "caddy")
	testenv.Bin(t, "grid-worker")
	testenv.Bin(t, "fakebrowser")
	cmd := exec.Command(bin, "-quick")
	cmd.Dir = testenv.RepoRoot(t)
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gridbench -quick: %v\n%s", err, out)
	}
	list, err := exec.Command(bin, "-list").Output()
	if err != nil {
		t.Fatal(err)
	}
	text := string(out)
	for i, name := range strings.Fields(string(list)) {
		at := strings.Index(text, "\n## "+name+"\n")
		if at < 0 {
			t.Errorf("section %s printed no heading", name)
			continue
		}
		body := text[at+1:]
		if end := strings.Index(body[1:], "\n## "); end >= 0 {
			body = body[:end+1]
		}
		if !strings.Contains(body, "\n|---|") {
			t.Errorf("section %s (%d) printed no table:\n%s", name, i, body)
		}
		// selection and memory report figures; the others hold a target
		if name != "selection" && name != "memory" && !strings.Contains(body, "| met |") && !strings.Contains(body, "| not met |") {
			t.Errorf("section %s printed no target with its verdict:\n%s", name, body)
		}
	}
}
