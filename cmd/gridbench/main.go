// Command gridbench measures the grid and prints every figure as a
// markdown table beside a baseline measured in the same run on the same
// machine, with its target and whether it is met. A missed target is a
// report, not a failure: only an error fails the run. Each section lives
// in its own file and registers itself in init; where two paths are
// compared their samples are interleaved, so that drift on a shared
// machine hits both alike.
//
//   - selection: the pure algorithms of package selection (no Redis):
//     decision time per policy and pool size, vnode imbalance, restarts
//     simulated.
//   - claim: on a private redis-server, with 1,000 and 10,000 workers
//     registered directly, each policy's claim and end inside Redis (INFO
//     commandstats) beside PING's, and the claim's p50 as a client sees it
//     beside a PING p50 taken interleaved on the same connection.
//   - redis-cpu: sessions through bin/caddy to 8 bin/grid-worker agents:
//     Redis CPU per session (INFO cpu) against Redis CPU per PING under
//     redis-benchmark, and the commands each session costs.
//   - connect: one bin/caddy serving the grid and a stock reverse_proxy
//     least_conn over the same agents: connect p50 of both, the grid's
//     extra time against a claim p50 plus half a PING, and sessions/s.
//   - relay: what the agent costs: one agent against its fakebrowser
//     dialled directly: connect p50, 1 KiB round trips per second, bulk
//     echo throughput in 1 MiB messages.
//   - recycle: two bin/caddy and two respawning agents with max_concurrent
//     2 and max_lifetime 3, clients opening 200 ms sessions through ten
//     worker restarts: free slots, time with none free, and each session's
//     wait, with stagger_drains on (the default) and off.
//   - fairness: two bin/caddy sharing a pool of 4 slots, one taking 4× the
//     other's arrivals at 1.2× capacity: each instance's clients' waits,
//     with the shared queue and with shared_queue off.
//   - first-page: a Playwright client's connect and first page on the
//     playwright and playwright-server launchers, through the grid and
//     direct.
//   - memory: Redis memory per worker and per live session record.
//
// The real parts are found beside the gridbench binary, else in bin/
// (make build); redis-server and redis-benchmark on PATH (make deps).
//
//	gridbench                  # every section (about two minutes)
//	gridbench -only claim      # the section named claim alone
//	gridbench -only relay -quick   # one section, small samples: a smoke run
//	gridbench -quick           # every section, small samples (figures not meaningful)
//	gridbench -list            # the sections' names
package main

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
)

// section is one part of the report: a heading and its tables.
type section struct {
	// name is short and unique; order sorts the report.
	name  string
	order int
	// run measures and prints; an error fails the whole run.
	run func(cfg *config) error
}

// config is what every section may read.
type config struct {
	// quick shrinks sample sizes (for a smoke run in tests).
	quick bool
	out   *os.File
}

var sections []section

func register(s section) { sections = append(sections, s) }

func main() {
	sort.Slice(sections, func(i, j int) bool { return sections[i].order < sections[j].order })
	var names []string
	for _, s := range sections {
		names = append(names, s.name)
	}
	only := flag.String("only", "", "run only the section of this name, else the sections whose name contains it (sections: "+strings.Join(names, ", ")+")")
	quick := flag.Bool("quick", false, "small samples: a smoke run, figures not meaningful")
	list := flag.Bool("list", false, "list the sections and exit")
	flag.Parse()

	if *list {
		for _, s := range sections {
			fmt.Println(s.name)
		}
		return
	}
	cfg := &config{quick: *quick, out: os.Stdout}
	ran := 0
	for _, s := range selectSections(sections, *only) {
		ran++
		start := time.Now()
		fmt.Printf("\n## %s\n\n", s.name)
		if err := s.run(cfg); err != nil {
			fmt.Fprintf(os.Stderr, "gridbench: %s: %v\n", s.name, err)
			os.Exit(1)
		}
		fmt.Printf("\n(%s took %s)\n", s.name, time.Since(start).Round(time.Millisecond))
	}
	if ran == 0 {
		fmt.Fprintf(os.Stderr, "gridbench: no section matches %q (see -list)\n", *only)
		os.Exit(2)
	}
}

// selectSections is what -only runs: every section for "", the section
// named only when there is one (so that -only claim does not also run a
// section whose name contains "claim"), else the sections whose name
// contains only.
func selectSections(all []section, only string) []section {
	if only == "" {
		return all
	}
	var out []section
	for _, s := range all {
		if s.name == only {
			return []section{s}
		}
		if strings.Contains(s.name, only) {
			out = append(out, s)
		}
	}
	return out
}
