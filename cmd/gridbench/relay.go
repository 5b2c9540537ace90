package main

// The relay section: what the agent's hop costs a session. One
// bin/grid-worker agent (fake launcher, every default) fronts a
// fakebrowser; its sessions are dialled at the agent with a claim ticket
// made here (unsigned: no worker secret), against the same fakebrowser
// dialled directly at the loopback address the agent's GET /status names.
// A third path is the floor of any hop in user space: the same
// fakebrowser behind a bare TCP relay (io.Copy both ways, in this
// process), which reads no frame and checks no claim. In rounds, the paths
// taking turns: connects (the handshake until the 101, alternating), 1 KiB
// echo round trips one at a time, and bulk echo of 1 MiB messages with a
// writer and a reader at once, each on one session per path kept open for
// the whole run.
//
//	gridbench -only relay          # about 5 s
//	gridbench -only relay -quick   # a smoke run

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/coder/websocket"

	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/workeragent"
)

func init() {
	register(section{name: "relay", order: 50, run: runRelay})
}

func runRelay(cfg *config) error {
	out := cfg.out
	connects, trips, bulk, rounds := 400, 4000, 256<<20, 8
	if cfg.quick {
		connects, trips, bulk, rounds = 30, 300, 8<<20, 2
	}
	const msgSize = 1 << 20
	w, err := newWorld()
	if err != nil {
		return err
	}
	defer w.close()
	if err := w.startAgents(1, benchPool); err != nil {
		return err
	}
	ws, err := w.available(benchPool)
	if err != nil {
		return err
	}
	wk := ws[0]
	backend, err := browserAddr(wk.Addr, wk.ID)
	if err != nil {
		return err
	}
	agent := route{name: "through the agent", url: "ws://" + wk.Addr + wk.Path, header: func() http.Header {
		t := registry.Ticket{Session: newID(), Group: wk.Group, Worker: wk.ID}.Signed(nil)
		return http.Header{registry.HeaderClaim: {t.String()}}
	}}
	direct := route{name: "direct to the fakebrowser", url: "ws://" + backend + wk.Path}
	hop, err := bareRelay(backend)
	if err != nil {
		return err
	}
	defer hop.Close()
	bare := route{name: "a bare TCP relay (io.Copy)", url: "ws://" + hop.Addr().String() + wk.Path}
	paths := []route{agent, direct, bare}
	conns := make([]*websocket.Conn, len(paths))
	for j, r := range paths {
		for range 20 { // warm up
			if _, err := r.connect(0); err != nil {
				return err
			}
		}
		c, _, err := r.dial()
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		defer c.CloseNow()
		c.SetReadLimit(2 * msgSize)
		conns[j] = c
	}

	lat := make([][]time.Duration, len(paths))
	tripTime := make([]time.Duration, len(paths))
	echoed := make([]int, len(paths))
	bulkTime := make([]time.Duration, len(paths))
	for r := range rounds {
		for i := range connects / rounds {
			for k := range paths {
				j := (i + k) % len(paths)
				d, err := paths[j].connect(0)
				if err != nil {
					return err
				}
				lat[j] = append(lat[j], d)
			}
		}
		for k := range paths {
			j := (r + k) % len(paths)
			d, err := roundTrips(conns[j], trips/rounds, 1024)
			if err != nil {
				return fmt.Errorf("%s, round trips: %w", paths[j].name, err)
			}
			tripTime[j] += d
			n, d, err := throughput(conns[j], bulk/rounds, msgSize)
			if err != nil {
				return fmt.Errorf("%s, bulk echo: %w", paths[j].name, err)
			}
			echoed[j] += n
			bulkTime[j] += d
		}
	}
	p50 := func(j int) float64 { return float64(quantile(lat[j], 0.5)) }
	rtps := func(j int) float64 { return float64(trips/rounds*rounds) / tripTime[j].Seconds() }
	mibps := func(j int) float64 { return float64(echoed[j]) / (1 << 20) / bulkTime[j].Seconds() }

	fmt.Fprintf(out, "One agent (fake launcher, defaults) and its fakebrowser; %d rounds of %d connects, %d round trips of 1 KiB and %d MiB echoed\n",
		rounds, connects/rounds, trips/rounds, bulk/rounds>>20)
	fmt.Fprintf(out, "in 1 MiB messages per path, the paths taking turns.\n\n")
	var rows [][]string
	for j, r := range paths {
		rows = append(rows, []string{r.name, us(quantile(lat[j], 0.5)), us(quantile(lat[j], 0.9)), f(rtps(j), 0), f(mibps(j), 0)})
	}
	table(out, []string{"path", "connect p50 (µs)", "connect p90 (µs)", "1 KiB round trips/s", "bulk echo MiB/s"}, rows...)
	goals(out,
		goal{"connect p50 through the agent", us(quantile(lat[0], 0.5)) + " µs", "direct " + us(quantile(lat[1], 0.5)) + " µs",
			ratio(p50(0), p50(1)), "≤ 1.15× direct", p50(0) <= 1.15*p50(1)},
		goal{"1 KiB round trips/s through the agent", f(rtps(0), 0) + "/s", "direct " + f(rtps(1), 0) + "/s",
			ratio(rtps(0), rtps(1)), "≥ 0.85× direct", rtps(0) >= 0.85*rtps(1)},
		goal{"bulk echo through the agent (1 MiB messages)", f(mibps(0), 0) + " MiB/s", "direct " + f(mibps(1), 0) + " MiB/s",
			ratio(mibps(0), mibps(1)), "≥ 0.95× direct", mibps(0) >= 0.95*mibps(1)},
	)
	fmt.Fprintf(out, "\nAgainst the bare relay, the floor of a hop: connect %s, round trips %s, bulk %s.\n",
		ratio(p50(0), p50(2)), ratio(rtps(0), rtps(2)), ratio(mibps(0), mibps(2)))
	return nil
}

// bareRelay listens on loopback and joins each connection to target with
// io.Copy both ways: no frame read, no claim checked.
func bareRelay(target string) (net.Listener, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer b.Close()
				go func() { _, _ = io.Copy(b, c); b.Close() }()
				_, _ = io.Copy(c, b)
			}()
		}
	}()
	return l, nil
}

// browserAddr is the loopback address of worker id's browser, from its
// agent's GET /status.
func browserAddr(agent, id string) (string, error) {
	resp, err := wsClient.Get("http://" + agent + "/status")
	if err != nil {
		return "", fmt.Errorf("reading the agent's status: %w", err)
	}
	defer resp.Body.Close()
	var st workeragent.AgentStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return "", fmt.Errorf("reading the agent's status: %w", err)
	}
	for _, b := range st.Browsers {
		if b.ID == id {
			return b.Backend, nil
		}
	}
	return "", fmt.Errorf("the agent at %s runs no browser %s", agent, id)
}
