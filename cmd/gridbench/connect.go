package main

// The connect section: what the grid adds to a connect, against stock
// reverse_proxy over the same agents. One bin/caddy serves two sites: the
// browser_grid handler (a claim in Redis, then the dial), and
// reverse_proxy with lb_policy least_conn whose upstreams are the eight
// agents' addresses. An agent serves only a request carrying a claim
// ticket, so the stock site writes one with header_up: a map from the
// upstream's port, which reverse_proxy sets once it has picked the
// upstream, to that agent's worker ID (map outputs are evaluated when
// read, and header_up is applied after the pick: checkStock verifies it
// on the wire), and {http.request.uuid} as the session ID. Both paths
// then run the same agent code, the agent's end call to Redis included
// (for a stock session it ends nothing); the grid's extra is its claim
// and Caddy's work around it.
//
// Connect p50 (the handshake until the 101), one client, the two paths
// alternating, with a claim p50 and a PING p50 taken between them on one
// connection to the same Redis, against the pool's real workers (each
// claim given back, untimed). Then sessions/s at 4 clients, in turns.
//
//	gridbench -only connect          # about 15 s
//	gridbench -only connect -quick   # a smoke run

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/browsergrid/caddy-browser-grid/workeragent"
)

func init() {
	register(section{name: "connect", order: 40, run: runConnect})
}

// handlerClaim is the claim a browser_grid handler with every default
// makes in group.
func handlerClaim(group string) registry.ClaimRequest {
	return registry.ClaimRequest{
		Group: group, Policy: registry.LifetimeFirst, Session: newID(), Instance: "gridbench",
		Limits: registry.Limits{StaggerDrains: true}, StaleAfter: 30 * time.Second, MaxScan: selection.DefaultVnodeMaxScan,
	}
}

func runConnect(cfg *config) error {
	out := cfg.out
	agents, clients, connects, turns, turnFor := 8, 4, 400, 5, time.Second
	if cfg.quick {
		connects, turns, turnFor = 30, 2, 300*time.Millisecond
	}
	w, err := newWorld()
	if err != nil {
		return err
	}
	defer w.close()
	ctx := context.Background()
	if err := w.startAgents(agents, benchPool, "--max-concurrent", "8"); err != nil {
		return err
	}
	workers, err := w.available(benchPool)
	if err != nil {
		return err
	}
	cad, err := w.startCaddy("caddy", 2, func(a []string) string {
		return gridSite(a[0], benchPool, "") + "\n" + stockSite(a[1], benchPool, workers)
	})
	if err != nil {
		return err
	}
	grid := route{name: "browser_grid", url: "ws://" + cad.sites[0] + "/"}
	stock := route{name: "reverse_proxy least_conn", url: "ws://" + cad.sites[1] + workers[0].Path}
	if err := checkStock(stock, workers); err != nil {
		return fmt.Errorf("%w\n%s", err, cad.tail())
	}
	for _, r := range []route{grid, stock} {
		if _, _, err := (load{clients: 2, total: 40}).run(r); err != nil {
			return fmt.Errorf("warming up: %w\n%s", err, cad.tail())
		}
	}

	one := redis.NewClient(&redis.Options{Addr: w.redis, PoolSize: 1})
	defer one.Close()
	reg := registry.New(one, registry.Options{})
	lat := map[string][]time.Duration{}
	var claims, pings []time.Duration
	for i := range connects {
		pair := []route{grid, stock}
		if i%2 == 1 {
			pair[0], pair[1] = stock, grid
		}
		for _, r := range pair {
			d, err := r.connect(0)
			if err != nil {
				return fmt.Errorf("%w\n%s", err, cad.tail())
			}
			lat[r.name] = append(lat[r.name], d)
		}
		t := time.Now()
		c, _, err := reg.Claim(ctx, handlerClaim(benchPool))
		if err != nil {
			return err
		}
		claims = append(claims, time.Since(t))
		t = time.Now()
		if err := one.Ping(ctx).Err(); err != nil {
			return err
		}
		pings = append(pings, time.Since(t))
		if _, err := reg.GiveBack(ctx, c.Group, c.Worker.ID, false, 0, c.Session); err != nil {
			return err
		}
	}

	done := map[string]int{}
	busy := map[string]time.Duration{}
	for t := range turns {
		pair := []route{grid, stock}
		if t%2 == 1 {
			pair[0], pair[1] = stock, grid
		}
		for _, r := range pair {
			ls, d, err := (load{clients: clients, d: turnFor}).run(r)
			if err != nil {
				return fmt.Errorf("%w\n%s", err, cad.tail())
			}
			done[r.name] += len(ls)
			busy[r.name] += d
		}
	}

	rate := func(r route) float64 { return float64(done[r.name]) / busy[r.name].Seconds() }
	fmt.Fprintf(out, "One bin/caddy, %d agents (fake launcher, -max-concurrent 8); %d connects per path alternating with a claim and a PING\n", agents, connects)
	fmt.Fprintf(out, "on one connection to the same Redis; sessions/s from %d clients in %d turns of %s per path.\n\n", clients, turns, turnFor)
	var rows [][]string
	for _, r := range []route{grid, stock} {
		rows = append(rows, []string{r.name, us(quantile(lat[r.name], 0.5)), us(quantile(lat[r.name], 0.9)), f(rate(r), 0)})
	}
	table(out, []string{"path", "connect p50 (µs)", "connect p90 (µs)", fmt.Sprintf("sessions/s, %d clients", clients)}, rows...)
	fmt.Fprintf(out, "Sessions/s, grid over stock: %s.\n\n", ratio(rate(grid), rate(stock)))
	cp, pp := quantile(claims, 0.5), quantile(pings, 0.5)
	table(out, []string{"Redis call, client-visible", "p50 (µs)", "p90 (µs)"},
		[]string{"claim (lifetime_first, the pool's workers)", us(cp), us(quantile(claims, 0.9))},
		[]string{"PING", us(pp), us(quantile(pings, 0.9))})
	extra := quantile(lat[grid.name], 0.5) - quantile(lat[stock.name], 0.5)
	bound := cp + pp/2
	goals(out, goal{"grid connect p50 − stock connect p50", us(extra) + " µs", "claim p50 " + us(cp) + " µs, PING p50 " + us(pp) + " µs",
		ratio(float64(extra), float64(bound)), "≤ claim p50 + 0.5 × PING p50 = " + us(bound) + " µs", extra <= bound})
	return nil
}

// stockSite is a site block proxying to every worker's agent with stock
// reverse_proxy, each request carrying the unsigned claim ticket the agent
// needs, for the worker behind the upstream least_conn picked.
func stockSite(addr, group string, workers []registry.WorkerInfo) string {
	var upstreams []string
	var b strings.Builder
	fmt.Fprintf(&b, "http://%s {\n\tmap {http.reverse_proxy.upstream.port} {gridbench_worker} {\n", addr)
	for _, wk := range workers {
		_, port, _ := net.SplitHostPort(wk.Addr)
		fmt.Fprintf(&b, "\t\t%s %s\n", port, wk.ID)
		upstreams = append(upstreams, wk.Addr)
	}
	// The claim's issue time is the request's: a ticket is taken once,
	// within a minute of it.
	ticket := registry.Ticket{Session: "{http.request.uuid}", Group: group, Worker: "{gridbench_worker}"}.Signed(nil).String()
	ticket = regexp.MustCompile(`;at=[0-9]+`).ReplaceAllString(ticket, ";at={time.now.unix_ms}")
	fmt.Fprintf(&b, "\t}\n\treverse_proxy %s {\n\t\tlb_policy least_conn\n\t\theader_up %s %q\n\t}\n}\n",
		strings.Join(upstreams, " "), registry.HeaderClaim, ticket)
	return b.String()
}

// checkStock opens one session per agent through the stock site at once
// and checks, on the wire, that each carried the ticket for the agent
// least_conn picked: the agent answers 101 only to a ticket naming its
// own worker (another is refused 503 "gone", one with no worker 400), the
// 101 carries the session ID the agent read from the ticket, a request
// UUID, and the sessions, all open at once, spread over the agents, so
// the worker in each ticket followed its upstream.
func checkStock(stock route, workers []registry.WorkerInfo) error {
	var open []*websocket.Conn
	defer func() {
		for _, c := range open {
			_ = c.Close(websocket.StatusNormalClosure, "")
		}
	}()
	ids := map[string]bool{}
	for range workers {
		c, resp, err := stock.dial()
		if err != nil {
			return fmt.Errorf("checking the stock site: %w", err)
		}
		open = append(open, c)
		id := resp.Header.Get(registry.HeaderSession)
		if len(id) != 36 || strings.Count(id, "-") != 4 {
			return fmt.Errorf("checking the stock site: the agent's 101 names session %q, not a request UUID", id)
		}
		ids[id] = true
	}
	hosting := 0 // agents holding one of the sessions
	for _, wk := range workers {
		resp, err := wsClient.Get("http://" + wk.Addr + "/status")
		if err != nil {
			return err
		}
		var st workeragent.AgentStatus
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("reading %s/status: %w", wk.Addr, err)
		}
		held := false
		for _, b := range st.Browsers {
			for _, s := range b.Sessions {
				if ids[s] {
					if b.ID != wk.ID {
						return fmt.Errorf("checking the stock site: session %s runs on %s, which Redis says is worker %s's agent", s, b.ID, wk.ID)
					}
					held = true
					delete(ids, s)
				}
			}
		}
		hosting += boolInt(held)
	}
	if len(ids) > 0 || hosting < 2 {
		return fmt.Errorf("checking the stock site: %d sessions on no agent, the others on %d agents; want every session on an agent, on more than one agent", len(ids), hosting)
	}
	return nil
}
