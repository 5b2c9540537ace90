// Command fakebrowser is a deterministic WebSocket server that stands in for
// a browser server in the grid's tests and load runs: it accepts WebSockets
// on one path, echoes, counts, and misbehaves on request. It prints each
// endpoint (ws://host:port/path) on its own line on stdout once listening,
// which is what grid-worker's "fake" and "exec" launchers read.
//
//	fakebrowser                                   # one server on a free port
//	fakebrowser -addr 127.0.0.1:9000 -path /ws    # a fixed address and path
//	fakebrowser -count 1000                       # 1,000 servers in one process
//	fakebrowser -refuse 503                       # refuse every upgrade
//	fakebrowser -close-after-messages 3 -echo-delay 100ms
//
// Each server also answers GET /stats (JSON counters), GET /health and
// POST /control (change the misbehavior at run time); see package fake.
// Exit codes: 0 after SIGTERM or SIGINT, 2 for bad flags, 3 for a crash
// asked for with -crash-on-session or -crash-after-sessions.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("fakebrowser", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address host:port (port 0 picks a free port)")
	path := fs.String("path", "/playwright", "WebSocket path")
	count := fs.Int("count", 1, "number of servers in this process, each on its own free port (needs port 0 when > 1)")
	verbose := fs.Bool("v", false, "log every session's start and end on stderr")
	var b fake.Behavior
	fs.IntVar(&b.Refuse, "refuse", 0, "answer every upgrade with this HTTP status instead of 101 (0: accept)")
	fs.BoolVar(&b.Hang, "hang", false, "hold every upgrade request open without answering")
	fs.DurationVar(&b.AcceptDelay, "accept-delay", 0, "wait this long before answering each upgrade")
	fs.DurationVar(&b.EchoDelay, "echo-delay", 0, "wait this long before echoing each message")
	fs.IntVar(&b.CloseAfterMessages, "close-after-messages", 0, "close each session after echoing this many messages (0: never)")
	fs.DurationVar(&b.CloseAfter, "close-after", 0, "close each session this long after it opened (0: never)")
	fs.DurationVar(&b.CloseDelay, "close-delay", 0, "keep a session this long after its peer went before closing it")
	fs.IntVar(&b.CrashOnSession, "crash-on-session", 0, "exit with code 3 right after accepting the Nth session (0: never)")
	fs.IntVar(&b.CrashAfterSessions, "crash-after-sessions", 0, "exit with code 3 once N sessions have ended (0: never)")
	ignoreTerm := fs.Bool("ignore-term", false, "ignore SIGTERM, as a browser that will not close itself: only SIGKILL (or SIGINT) ends it")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	// Validate through the same parser /control uses, so the rules agree.
	vals := url.Values{}
	fs.Visit(func(f *flag.Flag) { vals.Set(f.Name, f.Value.String()) })
	for _, k := range []string{"addr", "path", "count", "v", "ignore-term"} {
		vals.Del(k)
	}
	if _, err := (fake.Behavior{}).Apply(vals, ""); err != nil {
		fmt.Fprintf(os.Stderr, "fakebrowser: %v\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "fakebrowser: unexpected arguments %q\n", fs.Args())
		return 2
	}
	_, port, err := net.SplitHostPort(*addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakebrowser: -addr %q: %v\n", *addr, err)
		return 2
	}
	if *count < 1 {
		fmt.Fprintf(os.Stderr, "fakebrowser: -count must be at least 1, got %d\n", *count)
		return 2
	}
	if p, _ := strconv.Atoi(port); *count > 1 && p != 0 {
		fmt.Fprintf(os.Stderr, "fakebrowser: -count %d needs port 0 in -addr (got %q)\n", *count, *addr)
		return 2
	}

	opts := fake.Options{Path: *path, Behavior: b}
	if *verbose {
		opts.Log = func(msg string) { fmt.Fprintln(os.Stderr, "fakebrowser:", msg) }
	}
	// Signals are caught before the first endpoint is printed: whoever
	// reads it may stop this process at once.
	sig := make(chan os.Signal, 1)
	if *ignoreTerm {
		signal.Ignore(syscall.SIGTERM)
		signal.Notify(sig, syscall.SIGINT)
	} else {
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	}
	servers := make([]*fake.Server, 0, *count)
	for i := 0; i < *count; i++ {
		s, ep, err := fake.Start(*addr, opts)
		if err != nil {
			fmt.Fprintf(os.Stderr, "fakebrowser: %v\n", err)
			for _, s := range servers {
				s.Close()
			}
			return 1
		}
		servers = append(servers, s)
		fmt.Println(ep)
	}

	<-sig
	for _, s := range servers {
		s.Close()
	}
	return 0
}
