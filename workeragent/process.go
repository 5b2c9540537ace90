package workeragent

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Browser is a running browser server: the process the agent launched,
// the endpoint it printed, and how to check and stop it.
type Browser struct {
	// Endpoint is the WebSocket URL the browser printed.
	Endpoint *url.URL
	// Pid is the launched process (node, chromium, the exec command or
	// fakebrowser).
	Pid int
	// PlaywrightVersion is the major.minor of the playwright-core the
	// launcher loaded, as it reported it ("" for other launchers).
	PlaywrightVersion string
	// Video says the launcher can record video (an ffmpeg where
	// playwright-core looks for one).
	Video bool
	// Dir is the browser's own folder of temporary files ("" none).
	Dir string

	probe   probe
	cmd     *exec.Cmd
	flags   *flagServers // nil: the browser takes no flags
	done    chan struct{}
	waitErr error
	log     *zap.Logger
	cleanup []func()

	mu      sync.Mutex
	groups  []int // process groups to kill: the launched process's, and any the browser made for itself
	tail    []string
	stopped bool
	stopErr error
	stopMu  sync.Mutex
}

// probe is how the agent checks that a browser still answers.
type probe struct {
	// httpURL gets any HTTP response when set; otherwise a TCP connect to
	// addr must succeed.
	httpURL string
	addr    string
}

// Done is closed when the launched process has exited.
func (b *Browser) Done() <-chan struct{} { return b.done }

// ExitError is how the process ended (valid after Done).
func (b *Browser) ExitError() error { return b.waitErr }

// Groups are the process groups the agent kills when it stops the browser:
// the launched process's own and any the browser made for itself (Playwright
// starts Chromium as a group leader).
func (b *Browser) Groups() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int(nil), b.groups...)
}

// Output returns the last lines the process printed, for error messages.
func (b *Browser) Output() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.tail, "\n")
}

func (b *Browser) addGroup(pgid int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, g := range b.groups {
		if g == pgid {
			return
		}
	}
	b.groups = append(b.groups, pgid)
}

func (b *Browser) keep(line string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tail = append(b.tail, line)
	if len(b.tail) > 20 {
		b.tail = b.tail[len(b.tail)-20:]
	}
}

// Probe checks once that the browser answers within timeout.
func (b *Browser) Probe(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if b.probe.httpURL != "" {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.probe.httpURL, nil)
		if err != nil {
			return err
		}
		client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("probing %s: %w", b.probe.httpURL, err)
		}
		resp.Body.Close()
		return nil
	}
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", b.probe.addr)
	if err != nil {
		return fmt.Errorf("probing %s: %w", b.probe.addr, err)
	}
	return c.Close()
}

// Stop ends the browser: SIGTERM to its process group, SIGKILL to every
// group it made after grace (at once when grace is 0), then waits until no process of those groups
// is left, and removes its temporary files. Safe to call more than once.
func (b *Browser) Stop(grace time.Duration) error {
	b.stopMu.Lock()
	defer b.stopMu.Unlock()
	if b.stopped {
		return b.stopErr
	}
	b.stopped = true
	b.mu.Lock()
	groups := append([]int(nil), b.groups...)
	b.mu.Unlock()

	if grace > 0 {
		_ = syscall.Kill(-b.Pid, syscall.SIGTERM)
		// A stopped (frozen) process acts on SIGTERM only once continued.
		_ = syscall.Kill(-b.Pid, syscall.SIGCONT)
	}
	t := time.NewTimer(grace)
	select {
	case <-b.done:
	case <-t.C:
		b.log.Warn("browser did not stop in time; killing it", zap.Int("pid", b.Pid), zap.Duration("grace", grace))
	}
	t.Stop()
	for _, g := range groups {
		_ = syscall.Kill(-g, syscall.SIGKILL)
	}
	<-b.done
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := liveInGroups(groups)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			b.stopErr = fmt.Errorf("processes %v of the browser are still running after SIGKILL", left)
			break
		}
		for _, g := range groups {
			_ = syscall.Kill(-g, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, f := range b.cleanup {
		f()
	}
	return b.stopErr
}

// liveInGroups lists the processes (zombies excepted) whose process group
// is one of groups, by reading /proc. Where there is no /proc it asks the
// kernel whether each group still has members.
func liveInGroups(groups []int) []int {
	if len(groups) == 0 {
		return nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		var left []int
		for _, g := range groups {
			if syscall.Kill(-g, 0) == nil {
				left = append(left, g)
			}
		}
		return left
	}
	want := map[int]bool{}
	for _, g := range groups {
		want[g] = true
	}
	var left []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command name, which is in parentheses and may
		// hold spaces: state ppid pgrp ...
		s := string(raw)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if pg, err := strconv.Atoi(f[2]); err == nil && want[pg] {
			left = append(left, pid)
		}
	}
	return left
}

// wsURLRe finds a WebSocket endpoint in a line of output.
var wsURLRe = regexp.MustCompile(`wss?://[^\s"'<>]+`)

// pidRe finds the browser pid that launch-server.mjs prints.
var pidRe = regexp.MustCompile(`"browserPid"\s*:\s*(\d+)`)

// playwrightVersionRe finds the version of the playwright-core that
// launch-server.mjs loaded (its package.json's), as major.minor.
var playwrightVersionRe = regexp.MustCompile(`"playwrightVersion"\s*:\s*"(\d{1,4})\.(\d{1,4})\.`)

// videoRe finds launch-server.mjs's word on video.
var videoRe = regexp.MustCompile(`"video"\s*:\s*true\b`)

// startOptions describe one process launch.
type startOptions struct {
	name    string
	args    []string
	env     []string
	timeout time.Duration
	// probe builds the probe once the endpoint is known.
	probe   func(ep *url.URL) probe
	cleanup []func()
	// dir is the browser's folder of temporary files, removed with it.
	dir string
	// flags: the process serves run-servers with Chromium flags, asked
	// for on its stdin (launch-server.mjs's per-session mode).
	flags bool
}

// diskUse is how many bytes the files under dir take.
func diskUse(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// startProcess launches a browser server in its own process group and
// waits until it prints a ws:// or wss:// endpoint on stdout or stderr.
func startProcess(ctx context.Context, log *zap.Logger, o startOptions) (*Browser, error) {
	cmd := exec.Command(o.name, o.args...)
	cmd.Env = append(os.Environ(), o.env...)
	cmd.SysProcAttr = sysProcAttr()
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	var control io.WriteCloser
	if o.flags {
		if control, err = cmd.StdinPipe(); err != nil {
			return nil, err
		}
	}
	if err := cmd.Start(); err != nil {
		for _, f := range []*os.File{outR, outW, errR, errW} {
			f.Close()
		}
		for _, f := range o.cleanup {
			f()
		}
		return nil, fmt.Errorf("starting %s: %w", o.name, err)
	}
	outW.Close()
	errW.Close()
	b := &Browser{Pid: cmd.Process.Pid, cmd: cmd, done: make(chan struct{}), log: log, cleanup: o.cleanup, groups: []int{cmd.Process.Pid}, Dir: o.dir}
	if control != nil {
		b.flags = &flagServers{out: make(chan []byte, 1024), waiting: map[int]chan flagAnswer{}}
		go b.flags.write(control, b.done)
	}
	go func() {
		b.waitErr = cmd.Wait()
		close(b.done)
	}()

	found := make(chan *url.URL, 1)
	var once sync.Once
	scan := func(f *os.File, stream string) {
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			b.keep(line)
			if ce := log.Check(zap.DebugLevel, "browser output"); ce != nil {
				ce.Write(zap.String("stream", stream), zap.String("line", line))
			}
			if b.flags != nil && strings.HasPrefix(line, `{"event":"flags"`) {
				b.flags.answered(line)
				continue
			}
			if m := pidRe.FindStringSubmatch(line); m != nil {
				if pid, err := strconv.Atoi(m[1]); err == nil && pid > 0 {
					b.addGroup(pid) // Playwright makes the browser a group leader
				}
			}
			if m := playwrightVersionRe.FindStringSubmatch(line); m != nil {
				// before the endpoint is passed on: startProcess returns on it
				b.PlaywrightVersion = m[1] + "." + m[2]
			}
			if videoRe.MatchString(line) {
				b.Video = true
			}
			if m := wsURLRe.FindString(line); m != "" {
				if u, err := url.Parse(m); err == nil && u.Host != "" {
					once.Do(func() { found <- u })
				}
			}
		}
	}
	go scan(outR, "stdout")
	go scan(errR, "stderr")

	t := time.NewTimer(o.timeout)
	defer t.Stop()
	select {
	case u := <-found:
		b.Endpoint = u
		b.probe = o.probe(u)
		return b, nil
	case <-b.done:
		// Give the scanners a moment to collect the last words.
		time.Sleep(50 * time.Millisecond)
		_ = b.Stop(time.Second)
		return nil, fmt.Errorf("%s exited before printing a ws:// endpoint (%v); its last output:\n%s", o.name, b.waitErr, b.Output())
	case <-t.C:
		_ = b.Stop(2 * time.Second)
		return nil, fmt.Errorf("%s printed no ws:// endpoint within %s; its last output:\n%s", o.name, o.timeout, b.Output())
	case <-ctx.Done():
		_ = b.Stop(2 * time.Second)
		return nil, ctx.Err()
	}
}

// dialAddr is where the agent itself reaches an endpoint: an unspecified
// bind address (0.0.0.0, ::) is reached on loopback.
func dialAddr(u *url.URL) string {
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "wss" {
			port = "443"
		}
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// flagServers asks launch-server.mjs for run-servers whose browsers run
// with Chromium flags, and hears its answers.
type flagServers struct {
	// out queues the lines for the launcher's stdin: a launcher that
	// stops reading holds up no session, and a release never waits.
	out chan []byte

	mu      sync.Mutex
	next    int
	waiting map[int]chan flagAnswer
}

type flagAnswer struct {
	ID         int    `json:"id"`
	WSEndpoint string `json:"wsEndpoint"`
	Error      string `json:"error"`
}

func (f *flagServers) send(msg any) error {
	line, _ := json.Marshal(msg)
	select {
	case f.out <- append(line, '\n'):
		return nil
	default:
		return fmt.Errorf("the launcher reads no requests")
	}
}

// write passes the queued lines to w until the launcher exits.
func (f *flagServers) write(w io.WriteCloser, done <-chan struct{}) {
	defer w.Close()
	for {
		select {
		case line := <-f.out:
			if _, err := w.Write(line); err != nil {
				return
			}
		case <-done:
			return
		}
	}
}

func (f *flagServers) answered(line string) {
	var a flagAnswer
	if json.Unmarshal([]byte(line), &a) != nil {
		return
	}
	f.mu.Lock()
	ch := f.waiting[a.ID]
	delete(f.waiting, a.ID)
	f.mu.Unlock()
	if ch != nil {
		ch <- a
	}
}

// FlagServer returns the address of a browser server whose browsers run
// with args, and the function that gives it back once the session that
// uses it ended.
func (b *Browser) FlagServer(ctx context.Context, args []string) (string, func(), error) {
	f := b.flags
	if f == nil {
		return "", nil, fmt.Errorf("this worker's browser takes no flags")
	}
	ch := make(chan flagAnswer, 1)
	f.mu.Lock()
	f.next++
	id := f.next
	f.waiting[id] = ch
	f.mu.Unlock()
	var once sync.Once
	release := func() { once.Do(func() { _ = f.send(map[string]int{"release": id}) }) }
	fail := func(err error) (string, func(), error) {
		f.mu.Lock()
		delete(f.waiting, id)
		f.mu.Unlock()
		release()
		return "", nil, err
	}
	if err := f.send(map[string]any{"acquire": id, "args": args}); err != nil {
		return fail(fmt.Errorf("asking the launcher for a browser with flags: %w", err))
	}
	select {
	case a := <-ch:
		u, err := url.Parse(a.WSEndpoint)
		if a.Error != "" || err != nil || u.Host == "" {
			return fail(fmt.Errorf("the launcher could not start a browser with flags %v: %s", args, a.Error))
		}
		return dialAddr(u), release, nil
	case <-b.done:
		return fail(fmt.Errorf("the launcher exited"))
	case <-ctx.Done():
		return fail(fmt.Errorf("the launcher started no browser with flags %v in time: %w", args, ctx.Err()))
	}
}
