// Command gridbench measures the grid and prints every figure as a table of
// ratios against a baseline measured in the same run on the same machine.
// Each section lives in its own file and registers itself in init.
//
//	gridbench                 # every section
//	gridbench -only redis     # sections whose name contains "redis"
//	gridbench -only registry  # the section named "registry" alone
package main

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
)

// section is one table (or a few) of the report.
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

	if *claimerAddr != "" {
		// A claiming process started by the redis-targets section.
		os.Exit(claimerMain())
	}
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
// named only when there is one (so that -only registry does not also run
// registry-bounds), else the sections whose name contains only.
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
