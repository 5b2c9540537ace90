package chaos

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// WriteTable prints the results as one Markdown table: the figures, then
// PASS or what failed, with the notes below.
func WriteTable(w io.Writer, results []Result) {
	fmt.Fprintln(w, "| scenario | sessions tried | served | client-visible errors | excused (on the failed part) | slots leaked after | over-admissions | lifetime overshoots | time to heal (bound) | result |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, r := range results {
		leaked := strconv.Itoa(r.Leaked)
		if r.Leaked < 0 {
			leaked = "unknown"
		}
		heal := "never"
		if r.Healed {
			heal = r.Heal.Round(100 * time.Millisecond).String()
		}
		bound := r.HealBound.Round(100 * time.Millisecond).String()
		if r.HealBound == 0 {
			heal, bound = "—", "no fault"
		}
		verdict := "PASS"
		if !r.Passed() {
			verdict = "FAIL"
		}
		fmt.Fprintf(w, "| %s | %d | %d | %d | %d | %s | %d | %d | %s (%s) | %s |\n",
			r.Scenario, r.Tried, r.Served, r.Errors, r.Excused, leaked, r.OverAdmissions, r.Overshoots,
			heal, bound, verdict)
	}
	fmt.Fprintln(w)
	for _, r := range results {
		var parts []string
		if len(r.Notes) > 0 {
			parts = append(parts, strings.Join(r.Notes, "; "))
		}
		if !r.Passed() {
			parts = append(parts, "FAILED: "+strings.Join(r.Failures, "; "))
		}
		if len(parts) == 0 {
			parts = append(parts, "nothing to note")
		}
		fmt.Fprintf(w, "- %s (%s): %s\n", r.Scenario, r.Took.Round(100*time.Millisecond), strings.Join(parts, ". "))
	}
}
