package main

// What the sections measure with: WebSocket clients (connect, echo round
// trips, bulk echo, sessions from several clients at once), quantiles,
// Redis' own counters (INFO cpu and commandstats), and the markdown
// tables every figure is printed in.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/redis/go-redis/v9"
)

// route is one way to a browser: a WebSocket URL and the headers each new
// session sends.
type route struct {
	name string
	url  string
	// header makes a session's request headers (nil: none).
	header func() http.Header
}

// wsClient makes every request of the bench, sessions included: a
// transport of its own, which no proxy setting of the environment reaches.
var wsClient = &http.Client{Transport: &http.Transport{}}

// dial opens a session; the handshake has 10 s (the connection outlives
// that context). A refused upgrade returns its response with the error.
func (r route) dial() (*websocket.Conn, *http.Response, error) { return r.dialWithin(10 * time.Second) }

// dialWithin is dial with d for the handshake.
func (r route) dialWithin(d time.Duration) (*websocket.Conn, *http.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	opts := &websocket.DialOptions{HTTPClient: wsClient}
	if r.header != nil {
		opts.HTTPHeader = r.header()
	}
	return websocket.Dial(ctx, r.url, opts)
}

// connect opens a session, times its handshake until the 101, sends echo
// bytes and reads them back when echo > 0, and closes the session.
func (r route) connect(echo int) (time.Duration, error) {
	start := time.Now()
	c, _, err := r.dial()
	d := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", r.name, err)
	}
	defer c.CloseNow()
	if echo > 0 {
		if _, err := roundTrips(c, 1, echo); err != nil {
			return 0, fmt.Errorf("%s: %w", r.name, err)
		}
	}
	if err := c.Close(websocket.StatusNormalClosure, ""); err != nil {
		return 0, fmt.Errorf("%s: closing: %w", r.name, err)
	}
	return d, nil
}

// load is sessions opened from several clients at once: total of them in
// all, or as many as fit in d when total is 0.
type load struct {
	clients int
	total   int
	d       time.Duration
	// echo is the bytes each session echoes once (0: none).
	echo int
}

// run opens the sessions at r and returns each connect's time and how
// long the whole took.
func (l load) run(r route) ([]time.Duration, time.Duration, error) {
	var left atomic.Int64
	left.Store(int64(l.total))
	start := time.Now()
	end := start.Add(l.d)
	lats := make([][]time.Duration, l.clients)
	errs := make([]error, l.clients)
	var wg sync.WaitGroup
	for c := range l.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if l.total > 0 && left.Add(-1) < 0 || l.total == 0 && time.Now().After(end) {
					return
				}
				d, err := r.connect(l.echo)
				if err != nil {
					errs[c] = err
					return
				}
				lats[c] = append(lats[c], d)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return nil, 0, err
	}
	all := slices.Concat(lats...)
	if len(all) == 0 {
		return nil, 0, fmt.Errorf("%s: no session completed", r.name)
	}
	return all, took, nil
}

// roundTrips sends n messages of size bytes one after another, each
// waiting for its echo, and returns how long they took.
func roundTrips(c *websocket.Conn, n, size int) (time.Duration, error) {
	msg := bytes.Repeat([]byte("x"), size)
	ctx := context.Background()
	start := time.Now()
	for range n {
		if err := c.Write(ctx, websocket.MessageBinary, msg); err != nil {
			return 0, err
		}
		if _, got, err := c.Read(ctx); err != nil || len(got) != size {
			return 0, fmt.Errorf("echo of %d bytes: %d bytes, %v", size, len(got), err)
		}
	}
	return time.Since(start), nil
}

// throughput echoes total bytes in messages of size bytes, writing and
// reading at once, and returns the bytes echoed and the time it took.
func throughput(c *websocket.Conn, total, size int) (int, time.Duration, error) {
	n := max(1, total/size)
	msg := bytes.Repeat([]byte("y"), size)
	ctx := context.Background()
	start := time.Now()
	werr := make(chan error, 1)
	go func() {
		for range n {
			if err := c.Write(ctx, websocket.MessageBinary, msg); err != nil {
				werr <- err
				return
			}
		}
		werr <- nil
	}()
	// One buffer for every echo, so that the client's allocations weigh
	// on neither path (Read allocates each message afresh).
	var buf bytes.Buffer
	got := 0
	for range n {
		_, r, err := c.Reader(ctx)
		if err == nil {
			buf.Reset()
			_, err = buf.ReadFrom(r)
		}
		if err != nil {
			return 0, 0, fmt.Errorf("after %d bytes echoed: %w", got, err)
		}
		got += buf.Len()
	}
	if err := <-werr; err != nil {
		return 0, 0, err
	}
	return got, time.Since(start), nil
}

// quantile is the q-quantile of ds (nearest rank below).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

// newID is a fresh session ID: 128 random bits in hex.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// cpu is Redis' CPU time in seconds (INFO cpu, the whole process): user
// is Redis' own code (commands, Lua), sys the kernel's work for it
// (sockets, epoll, being woken).
type cpu struct{ user, sys float64 }

func (c cpu) total() float64    { return c.user + c.sys }
func (c cpu) minus(o cpu) cpu   { return cpu{c.user - o.user, c.sys - o.sys} }
func (c cpu) plus(o cpu) cpu    { return cpu{c.user + o.user, c.sys + o.sys} }
func (c cpu) per(n float64) cpu { return cpu{c.user / n, c.sys / n} }
func (c cpu) micros() (u, s, t string) {
	return f(c.user*1e6, 2), f(c.sys*1e6, 2), f(c.total()*1e6, 2)
}

// readCPU reads Redis' CPU time so far.
func readCPU(ctx context.Context, rdb *redis.Client) (cpu, error) {
	txt, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return cpu{}, fmt.Errorf("reading INFO cpu: %w", err)
	}
	var c cpu
	seen := 0
	for _, line := range strings.Split(txt, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		dst := map[string]*float64{"used_cpu_user": &c.user, "used_cpu_sys": &c.sys}[k]
		if dst == nil {
			continue
		}
		if *dst, err = strconv.ParseFloat(v, 64); err != nil {
			return cpu{}, fmt.Errorf("INFO cpu %s=%q: %w", k, v, err)
		}
		seen++
	}
	if seen != 2 {
		return cpu{}, errors.New("INFO cpu has no used_cpu_user and used_cpu_sys")
	}
	return c, nil
}

// cmdStat is one command's calls and time inside Redis (µs), from INFO
// commandstats. Commands a script or function runs count there too, each
// under its own name, and their time inside the script's.
type cmdStat struct{ calls, usec float64 }

func (s cmdStat) perCall() float64 {
	if s.calls == 0 {
		return 0
	}
	return s.usec / s.calls
}

type cmdStats map[string]cmdStat

// minus is the commands run between b and a.
func (a cmdStats) minus(b cmdStats) cmdStats {
	out := cmdStats{}
	for k, v := range a {
		if d := (cmdStat{v.calls - b[k].calls, v.usec - b[k].usec}); d.calls != 0 {
			out[k] = d
		}
	}
	return out
}

// nested sums the commands other than fcall and info: those a function
// ran, when only functions and INFO were sent.
func (a cmdStats) nested() cmdStat {
	var s cmdStat
	for k, v := range a {
		if k != "fcall" && k != "info" {
			s.calls += v.calls
			s.usec += v.usec
		}
	}
	return s
}

func (a cmdStats) add(b cmdStats) {
	for k, v := range b {
		s := a[k]
		a[k] = cmdStat{s.calls + v.calls, s.usec + v.usec}
	}
}

// readCommandStats reads INFO commandstats.
func readCommandStats(ctx context.Context, rdb *redis.Client) (cmdStats, error) {
	txt, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("reading INFO commandstats: %w", err)
	}
	out := cmdStats{}
	sc := bufio.NewScanner(strings.NewReader(txt))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "cmdstat_")
		if !ok {
			continue
		}
		name, fields, _ := strings.Cut(rest, ":")
		var s cmdStat
		for _, kv := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(kv, "=")
			x, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				s.calls = x
			case "usec":
				s.usec = x
			}
		}
		out[strings.ReplaceAll(name, "|", " ")] = s
	}
	return out, sc.Err()
}

// table prints a markdown table: the first column and the text columns
// left-aligned, a column whose every cell starts with a digit
// right-aligned.
func table(w io.Writer, head []string, rows ...[]string) {
	fmt.Fprintf(w, "| %s |\n|", strings.Join(head, " | "))
	for i := range head {
		numeric := i > 0 && len(rows) > 0
		for _, r := range rows {
			numeric = numeric && i < len(r) && r[i] != "" && (r[i][0] >= '0' && r[i][0] <= '9' || r[i][0] == '-')
		}
		if numeric {
			fmt.Fprint(w, "---:|")
		} else {
			fmt.Fprint(w, "---|")
		}
	}
	fmt.Fprintln(w)
	for _, r := range rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
	fmt.Fprintln(w)
}

// count prints a whole number with thousands separated: 10,000.
func count(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// goal is one target: the figure, the baseline measured beside it, their
// ratio, the target and whether the figure meets it.
type goal struct {
	what, measured, baseline, ratio, target string
	met                                     bool
}

// goals prints the targets' table.
func goals(w io.Writer, gs ...goal) {
	var rows [][]string
	for _, g := range gs {
		rows = append(rows, []string{g.what, g.measured, g.baseline, g.ratio, g.target, verdict(g.met)})
	}
	fmt.Fprintln(w, "Targets:")
	fmt.Fprintln(w)
	table(w, []string{"figure", "measured", "baseline (same run)", "ratio", "target", "verdict"}, rows...)
}

func verdict(met bool) string {
	if met {
		return "met"
	}
	return "not met"
}

// us prints a duration in µs.
func us(d time.Duration) string {
	x := float64(d.Nanoseconds()) / 1e3
	if x >= 100 {
		return f(x, 0)
	}
	return f(x, 1)
}

func f(x float64, prec int) string { return strconv.FormatFloat(x, 'f', prec, 64) }

// ratio prints a/b as "1.23×".
func ratio(a, b float64) string { return f(a/b, 2) + "×" }
