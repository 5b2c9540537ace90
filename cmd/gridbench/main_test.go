package main

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestQuickRun runs every section of the bench with small samples, so that
// 'make bench' cannot rot between the times someone runs it. The figures
// of a quick run mean nothing; what is checked is that each section runs
// against its real parts and prints its table.
func TestQuickRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs redis-server and bin/caddy; not in -short")
	}
	testenv.LookPath(t, "redis-server")
	bin := testenv.Bin(t, "gridbench")
	testenv.Bin(t, "caddy")
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
	for _, name := range strings.Fields(string(list)) {
		if !strings.Contains(string(out), "## "+name) {
			t.Errorf("section %s printed no heading", name)
		}
	}
	// the pinned part runs wherever Redis can have a CPU of its own
	// (pinning is implemented for Linux: pin_linux.go)
	if runtime.GOOS == "linux" && runtime.NumCPU() >= 2 && !strings.Contains(string(out), "Redis alone on CPU") {
		t.Errorf("redis-targets printed no figures with Redis pinned apart:\n%s", out)
	}
	// decisions/s batched beside every call alone (MaxBatch 1), same run
	if !strings.Contains(string(out), "with every call its own FCALL") {
		t.Errorf("redis-targets printed no decisions/s with every call alone:\n%s", out)
	}
	if n := strings.Count(string(out), "\n|"); n < 10 {
		t.Errorf("only %d table rows printed:\n%s", n, out)
	}
}
