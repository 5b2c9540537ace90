// Package testenv starts the real parts tests need (redis-server, the
// project's binaries) and finds the tools they use. Tests never share a
// server: each starts its own on a free port in its own temp dir.
//
// A missing part fails the test when CI=true and skips it otherwise, so a
// green CI run always means the part was there and was used.
package testenv

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// CI reports whether the tests run under CI (CI=true).
func CI() bool { return os.Getenv("CI") == "true" }

// Missing fails the test under CI and skips it elsewhere.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if CI() {
		t.Fatalf("required part missing (CI=true): %s", msg)
	}
	t.Skipf("skipping: %s (install it with 'make deps')", msg)
}

// LookPath finds an executable or calls Missing.
func LookPath(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, "%s not found on PATH", name)
	}
	return p
}

// RepoRoot is the directory holding go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate testenv source file")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Bin returns the path of a binary that 'make build' put in bin/.
func Bin(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(RepoRoot(t), "bin", name)
	if _, err := os.Stat(p); err != nil {
		Missing(t, "%s not built; run 'make build' first", p)
	}
	return p
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// WaitTCP polls addr until it accepts a connection or the timeout passes.
func WaitTCP(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not accepting connections after %s: %w", addr, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Redis is a redis-server started for one test.
type Redis struct {
	Addr string
	Dir  string
	Port int
	args []string
	cmd  *exec.Cmd
	t    testing.TB
}

// URL is the redis:// URL of the server.
func (r *Redis) URL() string { return "redis://" + r.Addr + "/0" }

// StartRedis starts redis-server on a free port with its data in a temp
// dir; it is stopped when the test ends. Extra arguments are passed as
// redis-server options (e.g. "--requirepass", "secret").
func StartRedis(t testing.TB, extra ...string) *Redis {
	t.Helper()
	bin := LookPath(t, "redis-server")
	r := &Redis{Dir: t.TempDir(), t: t}
	r.Port = FreePort(t)
	r.Addr = "127.0.0.1:" + strconv.Itoa(r.Port)
	r.args = append([]string{
		"--port", strconv.Itoa(r.Port), "--bind", "127.0.0.1",
		"--dir", r.Dir, "--save", "", "--appendonly", "no",
		"--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning",
	}, extra...)
	r.start(bin)
	t.Cleanup(r.Stop)
	return r
}

func (r *Redis) start(bin string) {
	r.t.Helper()
	r.cmd = exec.Command(bin, r.args...)
	r.cmd.Dir = r.Dir
	logf, err := os.Create(filepath.Join(r.Dir, "redis.log"))
	if err != nil {
		r.t.Fatalf("creating redis log: %v", err)
	}
	r.cmd.Stdout, r.cmd.Stderr = logf, logf
	if err := r.cmd.Start(); err != nil {
		r.t.Fatalf("starting redis-server: %v", err)
	}
	if err := WaitTCP(r.Addr, 10*time.Second); err != nil {
		r.t.Fatalf("redis-server did not start: %v (log in %s)", err, logf.Name())
	}
}

// Stop kills the server (like a crash: kill -9). Safe to call twice.
func (r *Redis) Stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		r.cmd = nil
	}
}

// Restart starts the server again on the same port, with an empty dataset.
func (r *Redis) Restart() {
	r.t.Helper()
	r.Stop()
	r.start(LookPath(r.t, "redis-server"))
}

// Process runs a long-lived child process for a test and stops it at the
// end. Its combined output is kept in a file and shown when the test fails.
type Process struct {
	Cmd     *exec.Cmd
	LogPath string
	done    chan struct{}
	err     error
}

// Start launches name with args; env entries are added to os.Environ().
func Start(t testing.TB, env []string, name string, args ...string) *Process {
	t.Helper()
	p := &Process{Cmd: exec.Command(name, args...), done: make(chan struct{})}
	p.Cmd.Env = append(os.Environ(), env...)
	f, err := os.CreateTemp(t.TempDir(), filepath.Base(name)+"-*.log")
	if err != nil {
		t.Fatal(err)
	}
	p.LogPath = f.Name()
	p.Cmd.Stdout, p.Cmd.Stderr = f, f
	if err := p.Cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() { p.err = p.Cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			b, _ := os.ReadFile(p.LogPath)
			t.Logf("--- output of %s %s ---\n%s", filepath.Base(name), strings.Join(args, " "), tail(string(b), 4000))
		}
	})
	return p
}

// Done is closed when the process exits.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitCode waits for the process to exit and returns its exit code.
func (p *Process) ExitCode(ctx context.Context) (int, error) {
	select {
	case <-p.done:
		return p.Cmd.ProcessState.ExitCode(), nil
	case <-ctx.Done():
		return -1, ctx.Err()
	}
}

// Stop sends SIGTERM, then SIGKILL after five seconds.
func (p *Process) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.Cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
}

// Output returns what the process printed so far.
func (p *Process) Output() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// WaitOutput polls the output until it contains s or the timeout passes.
func (p *Process) WaitOutput(s string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if strings.Contains(p.Output(), s) {
			return true
		}
		time.Sleep(25 * time.Millisecond)
	}
	return false
}

// Eventually polls cond until it is true or the timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	sc := bufio.NewScanner(strings.NewReader(s[len(s)-n:]))
	sc.Scan() // drop the partial first line
	var b strings.Builder
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	return b.String()
}
