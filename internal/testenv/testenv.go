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
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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
// Nothing stops another process from taking it before a child binds it:
// use it only for a port nothing will listen on, or with a starter that
// retries (StartRedis, StartCluster, StartSentinel pick their own ports
// and retry on "Address already in use").
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// pickPort returns a port below the kernel's ephemeral range (so that no
// outgoing connection takes it meanwhile) that is free now, and, with bus,
// whose Cluster bus port (port + 10000) is free too. Tests in other
// packages pick at random in the same range: a starter still retries when
// its child fails to bind.
var pickPort = pickFreePort

// PickPort returns a port below the kernel's ephemeral range that is free
// now. Like FreePort it can be taken before a child binds it: a starter
// that uses it must start again on another port when the child reports
// "address already in use" (as StartRedis does).
func PickPort(t testing.TB) int {
	t.Helper()
	return pickPort(t, false)
}

// PickPorts returns n distinct ports as PickPort does: picks made one by
// one may repeat (a process given the same port twice for two listeners
// binds both, and one of them answers for the other).
func PickPorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for len(ports) < n {
		if p := pickPort(t, false); !slices.Contains(ports, p) {
			ports = append(ports, p)
		}
	}
	return ports
}

func pickFreePort(t testing.TB, bus bool) int {
	t.Helper()
	for range 200 {
		p := 20000 + rand.IntN(12000)
		if !portFree(p) || (bus && !portFree(p+10000)) {
			continue
		}
		return p
	}
	t.Fatal("no free port found between 20000 and 32000")
	return 0
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// PortArg in StartRedis' extra arguments is replaced by a port picked for
// this start (a fresh one on every retry), e.g. "--tls-port", PortArg; the
// ports chosen are in Redis.ExtraPorts, in order.
const PortArg = "{testenv-port}"

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

// Redis is a redis-server (or a Sentinel, which is redis-server with a
// config file and --sentinel) started for one test. Every server runs with
// enable-debug-command yes, so a test can stall it with DEBUG SLEEP.
// Start, Kill, Restart and Running belong to one goroutine (the test's);
// Client may be called from any.
type Redis struct {
	Addr string
	Dir  string
	Port int
	// ExtraPorts are the ports that replaced PortArg in the arguments.
	ExtraPorts []int
	// conf is a config file written before each start (Sentinel), with
	// "{port}" replaced by the port; "" for none.
	conf    string
	extra   []string
	args    []string
	bus     bool // Cluster node: its bus port (Port+10000) must be free too
	cmd     *exec.Cmd
	exited  chan struct{}
	logPath string
	t       testing.TB
	mu      sync.Mutex
	client  *redis.Client // see Client
	// password is the --requirepass argument, for Client.
	password string
}

// URL is the redis:// URL of the server.
func (r *Redis) URL() string { return "redis://" + r.Addr + "/0" }

// StartRedis starts redis-server on a free port with its data in a temp
// dir; it is stopped when the test ends. Extra arguments are passed as
// redis-server options (e.g. "--requirepass", "secret"). When the server
// cannot bind its port (another process took it since it was picked), it
// is started again on another.
func StartRedis(t testing.TB, extra ...string) *Redis {
	t.Helper()
	r := &Redis{Dir: t.TempDir(), t: t, extra: extra}
	for i, a := range extra {
		switch {
		case a == "--cluster-enabled":
			r.bus = true
		case a == "--requirepass" && i+1 < len(extra):
			r.password = extra[i+1]
		}
	}
	r.launch(true)
	t.Cleanup(r.Stop)
	return r
}

// launch starts the server, on a new port when newPort (retrying with
// another while the port is taken), else on r.Port.
func (r *Redis) launch(newPort bool) {
	r.t.Helper()
	bin := LookPath(r.t, "redis-server")
	const attempts = 8
	for attempt := 1; ; attempt++ {
		if newPort {
			r.Port = pickPort(r.t, r.bus)
			r.ExtraPorts = r.ExtraPorts[:0]
		}
		r.Addr = "127.0.0.1:" + strconv.Itoa(r.Port)
		r.args = r.args[:0]
		if r.conf != "" {
			// Written once per port: a Sentinel rewrites its file with what
			// it learnt (the current master), which a restart keeps.
			path := filepath.Join(r.Dir, "server.conf")
			if newPort {
				conf := strings.ReplaceAll(r.conf, "{port}", strconv.Itoa(r.Port))
				if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
					r.t.Fatalf("writing %s: %v", path, err)
				}
			}
			r.args = append(r.args, path)
		}
		r.args = append(r.args,
			"--port", strconv.Itoa(r.Port), "--bind", "127.0.0.1",
			"--dir", r.Dir, "--save", "", "--appendonly", "no",
			"--protected-mode", "no", "--daemonize", "no", "--loglevel", "notice",
			"--enable-debug-command", "yes")
		n := 0
		for _, a := range r.extra {
			if a == PortArg {
				if newPort || n >= len(r.ExtraPorts) {
					r.ExtraPorts = append(r.ExtraPorts, pickPort(r.t, false))
				}
				a = strconv.Itoa(r.ExtraPorts[n])
				n++
			}
			r.args = append(r.args, a)
		}
		if r.conf != "" {
			r.args = append(r.args, "--sentinel")
		}
		err := r.start(bin)
		if err == nil {
			return
		}
		if !errors.Is(err, errPortTaken) || !newPort || attempt == attempts {
			r.t.Fatalf("redis-server %s: %v\n%s", strings.Join(r.args, " "), err, tail(r.log(), 3000))
		}
	}
}

var errPortTaken = errors.New("a port is taken")

// start runs the server and waits until its log says it accepts
// connections (its own: a port answering could be another process's).
func (r *Redis) start(bin string) error {
	r.t.Helper()
	r.cmd = exec.Command(bin, r.args...)
	r.cmd.Dir = r.Dir
	r.logPath = filepath.Join(r.Dir, "redis.log")
	logf, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		r.t.Fatalf("creating redis log: %v", err)
	}
	r.cmd.Stdout, r.cmd.Stderr = logf, logf
	if err := r.cmd.Start(); err != nil {
		logf.Close()
		r.t.Fatalf("starting redis-server: %v", err)
	}
	exited := make(chan struct{})
	r.exited = exited
	cmd := r.cmd
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		log := r.log()
		ready := "Ready to accept connections"
		if r.conf != "" {
			ready = "Sentinel ID is" // a sentinel logs no "Ready"
		}
		if strings.Contains(log, ready) {
			return nil
		}
		select {
		case <-exited:
			r.cmd = nil
			if strings.Contains(log, "in use") || strings.Contains(r.log(), "in use") {
				return errPortTaken
			}
			return errors.New("exited before accepting connections")
		default:
		}
		if time.Now().After(deadline) {
			return errors.New("not ready after 15s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *Redis) log() string {
	b, _ := os.ReadFile(r.logPath)
	return string(b)
}

// Log returns what the server logged since its last start.
func (r *Redis) Log() string { return r.log() }

// Stop kills the server (like a crash: kill -9). Safe to call twice.
func (r *Redis) Stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
		<-r.exited
		r.cmd = nil
	}
}

// Kill is Stop: kill -9, the server's data is lost.
func (r *Redis) Kill() { r.Stop() }

// Running reports whether the server process is alive.
func (r *Redis) Running() bool {
	if r.cmd == nil {
		return false
	}
	select {
	case <-r.exited:
		return false
	default:
		return true
	}
}

// Pid is the server's process ID (0 when stopped).
func (r *Redis) Pid() int {
	if !r.Running() {
		return 0
	}
	return r.cmd.Process.Pid
}

// Restart starts the server again on the same port, with an empty dataset
// (a Cluster node or a Sentinel keeps its nodes.conf or config file, so it
// rejoins as what it was). It fails the test if the port was taken
// meanwhile: clients know the server by its address.
func (r *Redis) Restart() {
	r.t.Helper()
	r.Stop()
	r.launch(false)
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
