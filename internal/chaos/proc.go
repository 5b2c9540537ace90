package chaos

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one child process of a scenario: its own process group (so a
// kill reaches what it started), its output in a log file, and SIGKILL
// when the harness itself dies (Pdeathsig), so nothing outlives a run.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// procs is every process a scenario started, stopped together at its end.
type procs struct {
	dir  string
	mu   sync.Mutex
	list []*proc
}

// start runs bin with args; env entries are added to the environment.
func (ps *procs) start(name string, env []string, bin string, args ...string) (*proc, error) {
	if err := os.MkdirAll(filepath.Join(ps.dir, "logs"), 0o755); err != nil {
		return nil, fmt.Errorf("creating the log dir: %w", err)
	}
	logPath := filepath.Join(ps.dir, "logs", name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the log of %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	ps.mu.Lock()
	ps.list = append(ps.list, p)
	ps.mu.Unlock()
	return p, nil
}

// stopAll ends every process, newest first: SIGTERM, then SIGKILL to the
// whole group after grace.
func (ps *procs) stopAll(grace time.Duration) {
	ps.mu.Lock()
	list := ps.list
	ps.list = nil
	ps.mu.Unlock()
	var wg sync.WaitGroup
	for i := len(list) - 1; i >= 0; i-- {
		wg.Add(1)
		go func(p *proc) { defer wg.Done(); p.stop(grace) }(list[i])
	}
	wg.Wait()
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill9 kills the whole process group at once (a crash, a lost machine).
func (p *proc) kill9() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// freeze stops the process itself (SIGSTOP), not its children: a GC
// pause or a network blip of the agent while its browser keeps serving.
// killOnly sends SIGKILL to the process itself, not its group.
func (p *proc) killOnly() { _ = p.cmd.Process.Kill() }

// It returns once the process is stopped (as /proc shows it, within a
// second): until then it may still answer, SIGSTOP being delivered when
// the process next runs.
func (p *proc) freeze() error {
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	stat := fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid)
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(stat)
		if err != nil {
			return nil // no /proc here: as good as it gets
		}
		// "pid (comm) state …": the state follows the last ')'
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'T' {
			return nil
		}
	}
	return nil
}

// thaw resumes a frozen process (SIGCONT).
func (p *proc) thaw() error { return p.cmd.Process.Signal(syscall.SIGCONT) }

func (p *proc) stop(grace time.Duration) {
	if p.exited() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		return
	}
	_ = p.thaw() // a frozen process cannot act on SIGTERM
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// tail returns the last n bytes of the process's log.
func (p *proc) tail(n int) string {
	b, _ := os.ReadFile(p.log)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
// The child binds it right after; the harness runs alone (make test runs
// it after the Go tests), so nothing else races for it.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitTCP polls addr until it accepts a connection, the process exits,
// or timeout passes.
func waitTCP(addr string, p *proc, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited before listening on %s: %s (log: %s)", p.name, addr, p.lastError(), p.log)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not accepting connections after %s: %w", addr, timeout, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// poll calls cond every interval until it returns true or timeout passes.
func poll(timeout, interval time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("timed out after %s waiting for %s: %w", timeout, what, last)
			}
			return errors.New("timed out after " + timeout.String() + " waiting for " + what)
		}
		time.Sleep(interval)
	}
}

// lastError returns the last log line that reports an error (or the last
// line), shortened: what an operator would look for first.
func (p *proc) lastError() string {
	lines := strings.Split(strings.TrimSpace(p.tail(8000)), "\n")
	line := lines[len(lines)-1]
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(strings.ToLower(lines[i]), "error") {
			line = lines[i]
			break
		}
	}
	if len(line) > 400 {
		line = line[:400] + "…"
	}
	return line
}
