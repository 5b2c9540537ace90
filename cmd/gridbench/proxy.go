package main

// The proxy section: what the grid costs a WebSocket client, measured in
// one run against one bin/caddy process serving two sites side by side:
// the browser_grid directive (a Redis claim per session, released on
// close) and stock reverse_proxy with lb_policy least_conn over the same
// fakebrowser workers, both beside a direct connection to a worker. The
// stock reverse_proxy hop is the baseline the grid is held to (DESIGN.md:
// that hop, not the direct connect, is what the grid adds to). Samples of
// the three paths are interleaved so drift on the shared machine hits all
// three alike.
//
//	gridbench -only proxy          # about 30 s
//	gridbench -only proxy -quick   # a few seconds, figures not meaningful
//
// bin/caddy is looked for beside the gridbench binary, then in bin/
// (GRIDBENCH_CADDY names another).

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

func init() {
	register(section{name: "proxy", order: 30, run: runProxy})
}

// proxyWorkers is the size of the pool behind both proxies.
const proxyWorkers = 4

// proxyPath is one way to reach a worker.
type proxyPath struct {
	name string
	// url returns the WebSocket URL of the i-th sample.
	url func(i int) string
}

func runProxy(cfg *config) error {
	w := cfg.out
	connects, msgs, bulk := 400, 4000, 64<<20
	if cfg.quick {
		connects, msgs, bulk = 30, 300, 4<<20
	}

	srv, err := regStartRedis()
	if err != nil {
		return err
	}
	defer srv.stop()
	rdb, err := registry.NewClient("redis://" + srv.addr + "/0")
	if err != nil {
		return err
	}
	defer rdb.Close()
	reg := registry.New(rdb, registry.Options{})

	var endpoints []*url.URL
	for i := range proxyWorkers {
		s, ep, err := fake.Start("127.0.0.1:0", fake.Options{Path: "/playwright"})
		if err != nil {
			return fmt.Errorf("starting fakebrowser %d: %w", i, err)
		}
		defer s.Close()
		u, _ := url.Parse(ep)
		endpoints = append(endpoints, u)
		err = reg.Register(context.Background(), registry.Registration{Pool: "bench", ID: fmt.Sprintf("w%d", i),
			BrowserType: "chromium", Addr: u.Host, Path: u.Path, TTL: time.Hour})
		if err != nil {
			return fmt.Errorf("registering fakebrowser %d: %w", i, err)
		}
	}

	cad, err := startBenchCaddy(srv.addr, endpoints)
	if err != nil {
		return err
	}
	defer cad.stop()

	paths := []proxyPath{
		{"direct to the worker", func(i int) string { return "ws://" + endpoints[i%len(endpoints)].Host + "/playwright" }},
		{"reverse_proxy least_conn", func(int) string { return "ws://" + cad.rpAddr + "/playwright" }},
		{"browser_grid lifetime_first", func(int) string { return "ws://" + cad.gridAddr + "/playwright/bench" }},
	}
	// Warm up every path (connections to Redis, EVALSHA caches, TCP).
	for _, p := range paths {
		for i := range 20 {
			if _, err := proxyConnect(p.url(i)); err != nil {
				return fmt.Errorf("%s: %w (caddy log: %s)", p.name, err, cad.logTail())
			}
		}
	}

	// Connect latency: handshake until the 101 is read, then close.
	lat := make([][]time.Duration, len(paths))
	for i := range connects {
		for j, p := range paths {
			d, err := proxyConnect(p.url(i))
			if err != nil {
				return fmt.Errorf("%s, connect %d: %w (caddy log: %s)", p.name, i, err, cad.logTail())
			}
			lat[j] = append(lat[j], d)
		}
	}
	// Small-message round trips (1 KiB, one at a time: a CDP client's
	// command and response) and bulk echo throughput (64 KiB messages, a
	// writer and a reader at once), one session per path, the paths
	// taking turns in rounds so drift hits them alike.
	conns := make([]*websocket.Conn, len(paths))
	for j, p := range paths {
		if conns[j], err = proxyDial(p.url(0)); err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		defer conns[j].Close(websocket.StatusNormalClosure, "")
		// The bulk echo reads 64 KiB messages, above the library's
		// default limit of 32 KiB.
		conns[j].SetReadLimit(fake.MaxMessageSize)
	}
	const rounds = 8
	rtts := make([][]time.Duration, len(paths))
	echoed := make([]int, len(paths))
	busy := make([]time.Duration, len(paths))
	for range rounds {
		for j, p := range paths {
			ds, err := proxyRoundTrips(conns[j], msgs/rounds)
			if err != nil {
				return fmt.Errorf("%s, round trips: %w", p.name, err)
			}
			rtts[j] = append(rtts[j], ds...)
			n, d, err := proxyThroughput(conns[j], bulk/rounds)
			if err != nil {
				return fmt.Errorf("%s, throughput: %w", p.name, err)
			}
			echoed[j] += n
			busy[j] += d
		}
	}
	rtt := make([]time.Duration, len(paths))
	tput := make([]float64, len(paths))
	for j := range paths {
		rtt[j] = proxyQuantile(rtts[j], 0.5)
		tput[j] = float64(echoed[j]) / (1 << 20) / busy[j].Seconds()
	}

	rp := 1
	fmt.Fprintf(w, "One bin/caddy, %d fakebrowser workers in this process, local redis-server; %d connects per path (interleaved),\n", proxyWorkers, connects)
	fmt.Fprintf(w, "%d round trips of 1 KiB and %d MiB echoed in 64 KiB messages per path.\n\n", msgs, bulk>>20)
	fmt.Fprintln(w, "| path | connect p50 (µs) | connect p90 (µs) | p50 / direct | p50 / reverse_proxy | 1 KiB round trip (µs) | / reverse_proxy | echo MiB/s | / reverse_proxy |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	p50 := func(j int) time.Duration { return proxyQuantile(lat[j], 0.5) }
	for j, p := range paths {
		fmt.Fprintf(w, "| %s | %s | %s | %.2f× | %.2f× | %s | %.2f× | %.0f | %.2f× |\n", p.name,
			regUS(p50(j)), regUS(proxyQuantile(lat[j], 0.9)),
			float64(p50(j))/float64(p50(0)), float64(p50(j))/float64(p50(rp)),
			proxyUS(rtt[j]), float64(rtt[j])/float64(rtt[rp]),
			tput[j], tput[j]/tput[rp])
	}
	grid := len(paths) - 1
	fmt.Fprintf(w, "\nThe grid's connect costs %.2f× stock reverse_proxy's (the claim is one Redis script before the dial and one after the close);\n",
		float64(p50(grid))/float64(p50(rp)))
	fmt.Fprintf(w, "once connected the bytes take the same path: round trips %.2f×, throughput %.2f× of reverse_proxy's.\n",
		float64(rtt[grid])/float64(rtt[rp]), tput[grid]/tput[rp])
	return nil
}

// proxyDial opens a session; the handshake has 10 s.
func proxyDial(u string) (*websocket.Conn, error) {
	// The context bounds the handshake only: the connection outlives it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, u, nil)
	return c, err
}

// proxyConnect opens a session, times the handshake, and closes it.
func proxyConnect(u string) (time.Duration, error) {
	start := time.Now()
	c, err := proxyDial(u)
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	return d, c.Close(websocket.StatusNormalClosure, "")
}

// proxyRoundTrips sends n 1 KiB messages one after another, each waiting
// for its echo, and returns each round trip.
func proxyRoundTrips(c *websocket.Conn, n int) ([]time.Duration, error) {
	msg := bytes.Repeat([]byte("x"), 1024)
	ds := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if err := c.Write(context.Background(), websocket.MessageBinary, msg); err != nil {
			return nil, err
		}
		if _, got, err := c.Read(context.Background()); err != nil || len(got) != len(msg) {
			return nil, fmt.Errorf("echo of %d bytes: %d bytes, %v", len(msg), len(got), err)
		}
		ds = append(ds, time.Since(start))
	}
	return ds, nil
}

// proxyThroughput echoes total bytes in 64 KiB messages, writing and
// reading at once, and returns the bytes echoed and the time it took.
func proxyThroughput(c *websocket.Conn, total int) (int, time.Duration, error) {
	const size = 64 << 10
	n := max(1, total/size)
	msg := bytes.Repeat([]byte("y"), size)
	start := time.Now()
	werr := make(chan error, 1)
	go func() {
		for range n {
			if err := c.Write(context.Background(), websocket.MessageBinary, msg); err != nil {
				werr <- err
				return
			}
		}
		werr <- nil
	}()
	// One buffer for every echo, so the client's allocations do not weigh
	// on the figure (the library's Read allocates each message afresh).
	var buf bytes.Buffer
	got := 0
	for range n {
		_, r, err := c.Reader(context.Background())
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

func proxyQuantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

func proxyUS(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Nanoseconds())/1e3, 'f', 1, 64)
}

// benchCaddy is the bin/caddy the section runs.
type benchCaddy struct {
	cmd      *exec.Cmd
	dir      string
	log      *os.File
	gridAddr string
	rpAddr   string
	// adminAddr serves Caddy's admin API (and /debug/pprof/).
	adminAddr string
}

func (c *benchCaddy) stop() {
	_ = c.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
	c.log.Close()
	_ = os.RemoveAll(c.dir)
}

func (c *benchCaddy) logTail() string {
	b, _ := os.ReadFile(c.log.Name())
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// findCaddy locates bin/caddy.
func findCaddy() (string, error) {
	if p := os.Getenv("GRIDBENCH_CADDY"); p != "" {
		return p, nil
	}
	var candidates []string
	if exe, err := os.Executable(); err == nil {
		candidates = append(candidates, filepath.Join(filepath.Dir(exe), "caddy"))
	}
	candidates = append(candidates, filepath.Join("bin", "caddy"))
	for _, c := range candidates {
		if fi, err := os.Stat(c); err == nil && !fi.IsDir() {
			return c, nil
		}
	}
	return "", fmt.Errorf("bin/caddy not found (looked at %s); run 'make build'", strings.Join(candidates, ", "))
}

// startBenchCaddy runs bin/caddy with the two sites on free ports.
func startBenchCaddy(redisAddr string, workers []*url.URL) (*benchCaddy, error) {
	return startCaddySites(redisAddr, "bench", workers)
}

// startCaddySites runs bin/caddy with two sites on free ports: browser_grid
// over pool, and stock reverse_proxy least_conn over workers as static
// upstreams.
func startCaddySites(redisAddr, pool string, workers []*url.URL) (*benchCaddy, error) {
	bin, err := findCaddy()
	if err != nil {
		return nil, err
	}
	// The three ports are taken at once (a port freed and taken again
	// could come back twice, most of all when thousands of fakebrowser
	// listeners crowd the ephemeral range).
	var ports [3]int
	var held []net.Listener
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		held = append(held, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range held {
		l.Close()
	}
	dir, err := os.MkdirTemp("", "gridbench-caddy-")
	if err != nil {
		return nil, err
	}
	var upstreams []string
	for _, u := range workers {
		upstreams = append(upstreams, u.Host)
	}
	c := &benchCaddy{dir: dir, gridAddr: fmt.Sprintf("127.0.0.1:%d", ports[1]), rpAddr: fmt.Sprintf("127.0.0.1:%d", ports[2]),
		adminAddr: fmt.Sprintf("127.0.0.1:%d", ports[0])}
	config := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	auto_https off
	persist_config off
	log {
		level WARN
	}
	grid {
		redis redis://%s/0
		stale_threshold 1h
		reaper_interval off
	}
}

http://%s {
	browser_grid %s
}

http://%s {
	reverse_proxy %s {
		lb_policy least_conn
	}
}
`, ports[0], redisAddr, c.gridAddr, pool, c.rpAddr, strings.Join(upstreams, " "))
	cfgPath := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		return nil, err
	}
	if c.log, err = os.Create(filepath.Join(dir, "caddy.log")); err != nil {
		return nil, err
	}
	c.cmd = exec.Command(bin, "run", "--config", cfgPath, "--adapter", "caddyfile")
	c.cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+filepath.Join(dir, "data"), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
	c.cmd.Stdout, c.cmd.Stderr = c.log, c.log
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, addr := range []string{c.gridAddr, c.rpAddr} {
		for {
			conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
			if err == nil {
				conn.Close()
				break
			}
			if time.Now().After(deadline) {
				tail := c.logTail()
				c.stop()
				return nil, fmt.Errorf("caddy did not listen on %s: %w\n%s", addr, err, tail)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return c, nil
}
