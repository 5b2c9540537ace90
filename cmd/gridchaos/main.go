// Command gridchaos runs the grid's reliability scenarios against real
// parts (redis-server, bin/caddy, bin/grid-worker with fakebrowser), each
// fault under client traffic, and prints one table of what clients saw
// and what the grid counted. It exits 1 when any figure is off its
// expectation, 2 for bad flags or missing parts.
//
//	gridchaos                       # every scenario, full length (make chaos)
//	gridchaos -short                # the short form (make test)
//	gridchaos -only redis-restart   # scenarios whose name contains a word
//	gridchaos -list                 # the scenarios and what each proves
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/browsergrid/caddy-browser-grid/internal/chaos"
)

// quietRedis drops go-redis' own log lines: the harness's client is
// expected to fail while a scenario has Redis down, and says so itself.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func main() {
	os.Exit(run())
}

func run() int {
	fs := flag.NewFlagSet("gridchaos", flag.ContinueOnError)
	short := fs.Bool("short", false, "the short form: same scenarios and expectations, shorter phases")
	only := fs.String("only", "", "run only these comma-separated scenarios: a word that names one runs it alone, another runs every scenario whose name contains it")
	bins := fs.String("bin", "bin", "directory holding caddy, grid-worker and fakebrowser")
	dir := fs.String("dir", "", "keep every scenario's logs and files here (default: a temp dir, kept only when a scenario fails)")
	list := fs.Bool("list", false, "list the scenarios and what each proves, then exit")
	quiet := fs.Bool("q", false, "print only the table")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "gridchaos: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *list {
		for _, s := range chaos.Scenarios() {
			fmt.Printf("%-18s %s\n", s.Name, s.Proves)
		}
		return 0
	}
	redis.SetLogger(quietRedis{})
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	opts := chaos.Options{Bins: *bins, Short: *short, Only: *only, Dir: *dir, Log: os.Stderr}
	if *quiet {
		opts.Log = nil
	}
	start := time.Now()
	results, err := chaos.Run(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gridchaos: %v\n", err)
		return 2
	}
	form := "full"
	if *short {
		form = "short"
	}
	fmt.Printf("\n## gridchaos (%s form, %s)\n\n", form, time.Since(start).Round(time.Second))
	chaos.WriteTable(os.Stdout, results)
	for _, r := range results {
		if !r.Passed() {
			return 1
		}
	}
	return 0
}
