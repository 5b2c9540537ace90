package caddygrid

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "grid",
		Usage: "status [--pool <pool>] [--watch] | drain <pool> <worker> | sessions [--pool <pool>] | end <session>",
		Short: "Shows the browser grid's pools, workers and sessions; drains a worker; ends a session",
		Long: `
Reads the grid through Caddy's admin API.

'caddy grid status' prints each pool as a table with a bar per worker: its
lifetime against max_lifetime and its active sessions against its capacity,
so the staircase (one worker pushed towards its limit while the others
wait) and the sawtooth (that worker restarting and starting again from
zero) can be watched in a terminal. --watch redraws every --interval until
Ctrl-C.

'caddy grid drain <pool> <worker>' drains a worker: it takes no new
session from then on, and its agent drains it (the live sessions finish)
and restarts it.

'caddy grid sessions' lists the live sessions of every Caddy instance
sharing the Redis; 'caddy grid end <session>' ends one: its agent closes
it with a close frame, "ended by the operator".

The admin address comes from --address, else from --config, else Caddy's
default (localhost:2019).
`,
		CobraFunc: func(cmd *cobra.Command) {
			status := &cobra.Command{
				Use:   "status [--pool <pool>] [--watch] [--interval <duration>]",
				Short: "Prints the pools and their workers' lifetime and active bars",
				Args:  cobra.NoArgs,
				RunE:  caddycmd.WrapCommandFuncForCobra(cmdGridStatus),
			}
			addAdminFlags(status)
			status.Flags().String("pool", "", "Show only this pool")
			status.Flags().Bool("watch", false, "Redraw until interrupted")
			status.Flags().Duration("interval", time.Second, "How often --watch redraws")
			drain := &cobra.Command{
				Use:   "drain <pool> <worker>",
				Short: "Drains a worker so that it restarts",
				Args:  cobra.ExactArgs(2),
				RunE: func(c *cobra.Command, args []string) error {
					return caddycmd.WrapCommandFuncForCobra(func(fl caddycmd.Flags) (int, error) {
						return cmdGridDrain(fl, args[0], args[1])
					})(c, args)
				},
			}
			addAdminFlags(drain)
			sessions := &cobra.Command{
				Use:   "sessions [--pool <pool>]",
				Short: "Lists the live sessions",
				Args:  cobra.NoArgs,
				RunE:  caddycmd.WrapCommandFuncForCobra(cmdGridSessions),
			}
			addAdminFlags(sessions)
			sessions.Flags().String("pool", "", "Show only this pool")
			end := &cobra.Command{
				Use:   "end <session>",
				Short: "Ends a session with a close frame, wherever it runs",
				Args:  cobra.ExactArgs(1),
				RunE: func(c *cobra.Command, args []string) error {
					return caddycmd.WrapCommandFuncForCobra(func(fl caddycmd.Flags) (int, error) {
						return cmdGridEnd(fl, args[0])
					})(c, args)
				},
			}
			addAdminFlags(end)
			cmd.AddCommand(status, drain, sessions, end)
		},
	})
}

func addAdminFlags(c *cobra.Command) {
	c.Flags().String("address", "", "The address of Caddy's admin API")
	c.Flags().StringP("config", "c", "", "Configuration file to read the admin address from")
	c.Flags().StringP("adapter", "a", "", "Name of the config adapter to use with --config")
}

func adminAddress(fl caddycmd.Flags) (string, error) {
	addr := fl.String("address")
	if addr != "" {
		return addr, nil
	}
	var config []byte
	configFile := fl.String("config")
	if configFile != "" {
		var err error
		config, configFile, _, err = caddycmd.LoadConfig(configFile, fl.String("adapter"))
		if err != nil {
			return "", err
		}
	}
	addr, err := caddycmd.DetermineAdminAPIAddress("", config, configFile, fl.String("adapter"))
	if err != nil {
		return "", fmt.Errorf("determining the admin API address: %w", err)
	}
	return addr, nil
}

// adminGet decodes a JSON answer of the admin API into v.
func adminGet(addr, uri string, v any) error {
	resp, err := caddycmd.AdminAPIRequest(addr, http.MethodGet, uri, nil, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("reading %s: %w", uri, err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("decoding %s: %w", uri, err)
	}
	return nil
}

func cmdGridStatus(fl caddycmd.Flags) (int, error) {
	addr, err := adminAddress(fl)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	pool := fl.String("pool")
	watch := fl.Bool("watch")
	interval := fl.Duration("interval")
	if interval <= 0 {
		return caddy.ExitCodeFailedStartup, fmt.Errorf("invalid --interval %s: must be positive", interval)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	for {
		pools, err := fetchPools(addr, pool)
		if err != nil {
			return caddy.ExitCodeFailedStartup, err
		}
		out := renderStatus(pools, time.Now())
		if watch {
			// Home the cursor and clear the screen, then redraw.
			out = "\x1b[H\x1b[2J" + out + fmt.Sprintf("\n(every %s; Ctrl-C to stop)\n", interval)
		}
		fmt.Print(out)
		if !watch {
			return caddy.ExitCodeSuccess, nil
		}
		select {
		case <-ctx.Done():
			return caddy.ExitCodeSuccess, nil
		case <-time.After(interval):
		}
	}
}

func fetchPools(addr, only string) ([]PoolDetail, error) {
	names := []string{only}
	if only == "" {
		var summaries []PoolSummary
		if err := adminGet(addr, "/grid/pools", &summaries); err != nil {
			return nil, err
		}
		names = names[:0]
		for _, s := range summaries {
			names = append(names, s.Pool)
		}
		sort.Strings(names)
	}
	details := make([]PoolDetail, 0, len(names))
	for _, name := range names {
		var d PoolDetail
		if err := adminGet(addr, "/grid/pools/"+url.PathEscape(name), &d); err != nil {
			return nil, err
		}
		details = append(details, d)
	}
	return details, nil
}

func cmdGridDrain(fl caddycmd.Flags, pool, worker string) (int, error) {
	addr, err := adminAddress(fl)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	uri := "/grid/pools/" + url.PathEscape(pool) + "/workers/" + url.PathEscape(worker) + "/drain"
	resp, err := caddycmd.AdminAPIRequest(addr, http.MethodPost, uri, nil, nil)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	resp.Body.Close()
	fmt.Printf("worker %s of pool %s drains and restarts\n", worker, pool)
	return caddy.ExitCodeSuccess, nil
}

func cmdGridSessions(fl caddycmd.Flags) (int, error) {
	addr, err := adminAddress(fl)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	q := url.Values{}
	if p := fl.String("pool"); p != "" {
		q.Set("pool", p)
	}
	var all []SessionOut
	for {
		var page SessionsPage
		if err := adminGet(addr, "/grid/sessions?"+q.Encode(), &page); err != nil {
			return caddy.ExitCodeFailedStartup, err
		}
		all = append(all, page.Sessions...)
		if page.Next == "" {
			break
		}
		q.Set("cursor", page.Next)
	}
	fmt.Print(renderSessions(all))
	return caddy.ExitCodeSuccess, nil
}

// renderSessions draws the sessions as a table, oldest first.
func renderSessions(ss []SessionOut) string {
	if len(ss) == 0 {
		return "no live sessions\n"
	}
	sort.Slice(ss, func(i, j int) bool { return ss[i].Started.Before(ss[j].Started) })
	var b bytes.Buffer
	fmt.Fprintf(&b, "%-26s  %-10s  %-8s  %-7s  %-24s  %-8s  %-8s  %s\n", "SESSION", "POOL", "VERSION", "STATE", "WORKER", "AGE", "IDLE", "LABEL")
	for _, s := range ss {
		fmt.Fprintf(&b, "%-26s  %-10s  %-8s  %-7s  %-24s  %-8s  %-8s  %s\n", printable(s.ID), printable(s.Pool), printable(s.Version),
			s.State, printable(s.Worker), (time.Duration(s.AgeMS) * time.Millisecond).Round(time.Second),
			(time.Duration(s.IdleMS) * time.Millisecond).Round(time.Second), printable(s.Label))
	}
	return b.String()
}

func cmdGridEnd(fl caddycmd.Flags, session string) (int, error) {
	addr, err := adminAddress(fl)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	resp, err := caddycmd.AdminAPIRequest(addr, http.MethodDelete, "/grid/sessions/"+url.PathEscape(session), nil, nil)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	resp.Body.Close()
	fmt.Printf("session %s ends\n", session)
	return caddy.ExitCodeSuccess, nil
}

// barWidth is the width of the lifetime bar; the active bar is one cell a
// session.
const barWidth = 20

// renderStatus draws every pool as a table, workers by lifetime, highest
// first, so the staircase reads top to bottom.
func renderStatus(pools []PoolDetail, now time.Time) string {
	var b bytes.Buffer
	if len(pools) == 0 {
		b.WriteString("no pools: no worker has registered yet\n")
		return b.String()
	}
	for i, p := range pools {
		if i > 0 {
			b.WriteByte('\n')
		}
		limit, mc := "none", 0
		if c := p.Configured; c != nil {
			if c.MaxLifetime > 0 {
				limit = fmt.Sprint(c.MaxLifetime)
			}
			mc = c.MaxConcurrent
		}
		fmt.Fprintf(&b, "pool %s: %d workers (%d available, %d leaving), %d sessions, %d waiting, max_lifetime %s",
			printable(p.Pool), len(p.Workers), p.Available, p.Leaving, p.Active, p.QueueDepth, limit)
		if p.Configured == nil {
			b.WriteString(" (this configuration does not name the pool)")
		}
		if len(p.Versions) > 0 {
			fmt.Fprintf(&b, ", Playwright %s", printable(strings.Join(p.Versions, ", ")))
		}
		b.WriteByte('\n')
		ws := append([]WorkerStatus(nil), p.Workers...)
		sort.SliceStable(ws, func(i, j int) bool {
			if ws[i].Lifetime != ws[j].Lifetime {
				return ws[i].Lifetime > ws[j].Lifetime
			}
			return ws[i].ID < ws[j].ID
		})
		idWidth := 6
		for i := range ws {
			ws[i].ID, ws[i].Status = printable(ws[i].ID), printable(ws[i].Status)
			idWidth = max(idWidth, len(ws[i].ID))
		}
		fmt.Fprintf(&b, "  %-*s  %-9s  %-*s  %-14s  %s\n", idWidth, "WORKER", "STATUS", barWidth+8, "LIFETIME", "ACTIVE", "HEARTBEAT")
		ml := 0
		if p.Configured != nil {
			ml = p.Configured.MaxLifetime
		}
		for _, w := range ws {
			fmt.Fprintf(&b, "  %-*s  %-9s  %s  %s  %s", idWidth, w.ID, w.Status,
				lifetimeBar(w.Lifetime, ml), activeBar(w.Active, effectiveCap(w.Capacity, mc)), w.HeartbeatAge)
			if w.Version != "" {
				fmt.Fprintf(&b, "  Playwright %s", printable(w.Version))
			}
			if w.Held {
				b.WriteString("  (last session held: its previous browser drains)")
			}
			b.WriteByte('\n')
		}
		for _, bad := range p.BadRecords {
			fmt.Fprintf(&b, "  %-*s  bad record skipped: %s\n", idWidth, printable(bad.ID), printable(bad.Error))
		}
	}
	return b.String()
}

// printable is s when every rune of it prints, else s quoted: what the
// status shows comes from Redis, where any writer can put terminal escapes
// and line breaks into a worker's name.
func printable(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// lifetimeBar draws lifetime against the limit in barWidth cells (against
// the lifetime itself when there is no limit), with the figures after it.
func lifetimeBar(lifetime, limit int) string {
	scale := limit
	if scale <= 0 {
		scale = max(lifetime, 1)
	}
	filled := min(barWidth, lifetime*barWidth/scale)
	figure := fmt.Sprintf("%d/%d", lifetime, limit)
	if limit <= 0 {
		figure = fmt.Sprint(lifetime)
	}
	return strings.Repeat("█", filled) + strings.Repeat("░", barWidth-filled) + fmt.Sprintf(" %-7s", figure)
}

// activeBar draws one cell per slot: filled for a live session.
func activeBar(active, cap int) string {
	if cap <= 0 {
		return fmt.Sprintf("%-14s", fmt.Sprintf("%d (no cap)", active))
	}
	cells := min(cap, 8)
	filled := min(cells, active*cells/cap)
	return fmt.Sprintf("%s%s %-5s", strings.Repeat("█", filled), strings.Repeat("░", cells-filled), fmt.Sprintf("%d/%d", active, cap)) +
		strings.Repeat(" ", max(0, 8-cells))
}
