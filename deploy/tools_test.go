package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The repository's own binaries, built by `make build`. The Makefile passes
// their paths; run by hand, the tests look in ../bin.
const (
	workerEnv = "GRID_WORKER_BIN"
	caddyEnv  = "GRID_CADDY_BIN"
)

// tool returns the path of a binary the checks need. A missing one fails
// the test under CI=true (CI must check everything) and skips it otherwise.
func tool(t *testing.T, env, fallback string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		p = fallback
	}
	if _, err := os.Stat(p); err != nil {
		msg := fmt.Sprintf("%s not found (%v): run `make build`, or set %s", p, err, env)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return p
}

// workerHelp is what `grid-worker -help` says: its flags, the environment
// variable of each and the defaults it prints.
type workerHelp struct {
	flags    map[string]bool   // "drain-timeout"
	env      map[string]bool   // "DRAIN_TIMEOUT"
	defaults map[string]string // by env var: "DRAIN_TIMEOUT" -> "30s"
	// stopMargin: a stop on SIGTERM takes at most the drain timeout plus
	// this ("at most -drain-timeout + 10s").
	stopMargin time.Duration
}

var (
	helpOnce sync.Once
	helpVal  workerHelp
	helpErr  error
)

var (
	helpFlagLine = regexp.MustCompile(`^\s+-([a-z0-9][a-z0-9-]*)\b`)
	helpEnvNote  = regexp.MustCompile(`\(env ([A-Z][A-Z0-9_]*)(?:, default ([^)]*))?\)\s*$`)
	helpStopNote = regexp.MustCompile(`at most\s+-drain-timeout \+ ([0-9a-z.]+)`)
)

// gridWorkerHelp runs the binary built by make build once per test run.
func gridWorkerHelp(t *testing.T) workerHelp {
	t.Helper()
	bin := tool(t, workerEnv, filepath.Join("..", "bin", "grid-worker"))
	helpOnce.Do(func() {
		var out bytes.Buffer
		cmd := exec.Command(bin, "-help")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			helpErr = fmt.Errorf("running %s -help: %w\n%s", bin, err, out.String())
			return
		}
		helpVal, helpErr = parseWorkerHelp(out.String())
	})
	if helpErr != nil {
		t.Fatal(helpErr)
	}
	return helpVal
}

func parseWorkerHelp(text string) (workerHelp, error) {
	h := workerHelp{flags: map[string]bool{}, env: map[string]bool{}, defaults: map[string]string{}}
	for _, line := range strings.Split(text, "\n") {
		if m := helpFlagLine.FindStringSubmatch(line); m != nil {
			h.flags[m[1]] = true
		}
		if m := helpEnvNote.FindStringSubmatch(line); m != nil {
			h.env[m[1]] = true
			if m[2] != "" {
				h.defaults[m[1]] = m[2]
			}
		}
	}
	if m := helpStopNote.FindStringSubmatch(text); m != nil {
		d, err := time.ParseDuration(m[1])
		if err != nil {
			return h, fmt.Errorf("grid-worker -help: stop margin %q: %v", m[1], err)
		}
		h.stopMargin = d
	} else {
		return h, fmt.Errorf("grid-worker -help does not say how long a stop takes at most (\"at most -drain-timeout + ...\"):\n%s", text)
	}
	if len(h.flags) < 10 || len(h.env) < 10 {
		return h, fmt.Errorf("grid-worker -help: found %d flags and %d variables; has its format changed?\n%s",
			len(h.flags), len(h.env), text)
	}
	return h, nil
}

// checkEnv fails for every name that is not a grid-worker variable.
// Names in allowed are the file's own (POD_IP, used to build another).
func (h workerHelp) checkEnv(t *testing.T, where string, names []string, allowed ...string) {
	t.Helper()
	for _, n := range names {
		if !h.env[n] && !contains(allowed, n) {
			t.Errorf("%s: %s is not a grid-worker environment variable (grid-worker -help)", where, n)
		}
	}
}

// drainTimeout is the drain timeout a worker started with these
// variables and arguments uses: its -drain-timeout flag, else its
// DRAIN_TIMEOUT, else the default grid-worker prints.
func (h workerHelp) drainTimeout(t *testing.T, where string, env map[string]string, args []string) time.Duration {
	t.Helper()
	v, ok := flagValue(args, "drain-timeout")
	what := "-drain-timeout"
	if !ok {
		v, ok = env["DRAIN_TIMEOUT"]
		what = "DRAIN_TIMEOUT"
	}
	if !ok {
		v, ok = h.defaults["DRAIN_TIMEOUT"]
		if !ok {
			t.Fatalf("grid-worker -help prints no default for DRAIN_TIMEOUT")
		}
	}
	d, err := workerDuration(v)
	if err != nil {
		t.Fatalf("%s: %s %q: %v", where, what, v, err)
	}
	return d
}

// flagValue is the value args give the grid-worker flag name (-name v,
// -name=v, --name v or --name=v; the last one wins, as in the flag
// package), and whether they give one.
func flagValue(args []string, name string) (string, bool) {
	v, ok := "", false
	for i, a := range args {
		f, isFlag := strings.CutPrefix(a, "-")
		if !isFlag {
			continue
		}
		f = strings.TrimPrefix(f, "-")
		if f == name && i+1 < len(args) {
			v, ok = args[i+1], true
		} else if val, found := strings.CutPrefix(f, name+"="); found {
			v, ok = val, true
		}
	}
	return v, ok
}

// checkStopGrace fails unless a supervisor's grace before SIGKILL is above
// the longest stop of a worker with these variables and arguments: its
// drain timeout plus the margin grid-worker -help states.
func (h workerHelp) checkStopGrace(t *testing.T, where, field string, grace time.Duration, env map[string]string, args []string) {
	t.Helper()
	need := h.drainTimeout(t, where, env, args) + h.stopMargin
	if grace <= need {
		t.Errorf("%s: %s %v is not above the longest stop, %v (drain timeout + %v, grid-worker -help)", where, field, grace, need, h.stopMargin)
	}
}

// workerDuration reads a duration the way grid-worker does: a Go duration
// or bare seconds.
func workerDuration(v string) (time.Duration, error) {
	if n, err := strconv.Atoi(v); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	return time.ParseDuration(v)
}

// adaptCaddyfile checks a Caddyfile the way make examples does: it adapts
// and validates with the repository's bin/caddy, and is formatted as
// `caddy fmt` would write it.
func adaptCaddyfile(t *testing.T, where, text string) {
	t.Helper()
	bin := tool(t, caddyEnv, filepath.Join("..", "bin", "caddy"))
	f := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(f, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) {
		cmd := exec.Command(bin, args...)
		// worker_secret {env.GRID_WORKER_SECRET} is read when the config
		// loads, which --validate does.
		cmd.Env = append(os.Environ(), "GRID_WORKER_SECRET=deploy-check-only")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: caddy %s: %v\n%s", where, strings.Join(args, " "), err, out)
		}
	}
	run("adapt", "--config", f, "--adapter", "caddyfile", "--validate")
	run("fmt", "--diff", f)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func TestParseWorkerHelp(t *testing.T) {
	h, err := parseWorkerHelp(`Usage: grid-worker [flags]

A stop on SIGTERM takes at most -drain-timeout + 10s, whatever Redis does:
give the supervisor longer than that before it kills the agent.

  -drain-timeout value
    	longest wait for active sessions when draining (env DRAIN_TIMEOUT, default 30s)
  -respawn
    	after a drain start anew (env RESPAWN, default false)
  -worker-secret value
    	sign the record (Caddy's worker_secret); prefer the variable (env GRID_WORKER_SECRET)
  -a value
    	a (env A_1, default 1)
  -b value
    	b (env B_1, default 1)
  -c value
    	c (env C_1, default 1)
  -d value
    	d (env D_1, default 1)
  -e value
    	e (env E_1, default 1)
  -f value
    	f (env F_1, default 1)
  -g value
    	g (env G_1, default 1)
`)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"drain-timeout", "respawn", "worker-secret"} {
		if !h.flags[f] {
			t.Errorf("flag %s not found", f)
		}
	}
	if !h.env["GRID_WORKER_SECRET"] || h.defaults["DRAIN_TIMEOUT"] != "30s" || h.defaults["RESPAWN"] != "false" || h.stopMargin != 10*time.Second {
		t.Errorf("parsed %+v", h)
	}
	if _, err := parseWorkerHelp("nothing here"); err == nil {
		t.Error("a help text without flags was accepted")
	}
}
