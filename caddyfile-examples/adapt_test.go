// Package examples holds the runnable Caddyfiles of the grid. Each
// X.Caddyfile is also a golden adapt test: adapting it must give X.json
// exactly (go test -run TestExamples -update rewrites the goldens, to be
// reviewed like code). The harness follows caddy-l4's integration tests.
package examples

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/browsergrid/caddy-browser-grid/caddygrid"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite the golden .json files from the adapter's output")

func TestMain(m *testing.M) {
	// The examples read {$GRID_REDIS:default}; adapt them with the default.
	os.Unsetenv("GRID_REDIS")
	os.Exit(m.Run())
}

// adapt runs the Caddyfile adapter as 'caddy adapt' does, and indents the
// result the way the golden files are written.
func adapt(filename string, src []byte) ([]byte, []caddyconfig.Warning, error) {
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": filename})
	if err != nil {
		return nil, warnings, err
	}
	return indent(out), warnings, nil
}

func indent(b []byte) []byte {
	var buf bytes.Buffer
	if err := json.Indent(&buf, b, "", "\t"); err != nil {
		return b
	}
	buf.WriteByte('\n')
	return buf.Bytes()
}

func examples(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no *.Caddyfile in caddyfile-examples")
	}
	return files
}

func golden(caddyfile string) string { return strings.TrimSuffix(caddyfile, ".Caddyfile") + ".json" }

// TestExamplesAdapt adapts every example in-process and compares it with
// its golden JSON.
func TestExamplesAdapt(t *testing.T) {
	for _, f := range examples(t) {
		t.Run(f, func(t *testing.T) {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			got, warnings, err := adapt(f, src)
			if err != nil {
				t.Fatalf("adapting %s: %v", f, err)
			}
			for _, w := range warnings {
				t.Errorf("adapting %s: warning at line %d: %s", f, w.Line, w.Message)
			}
			if *update {
				if err := os.WriteFile(golden(f), got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden(f))
			if err != nil {
				t.Fatalf("reading golden file (create it with -update): %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("adapting %s does not give %s (rerun with -update if the change is intended):\n%s",
					f, golden(f), firstDiff(string(want), string(got)))
			}
		})
	}
}

// TestExamplesAdaptWithCaddyBinary runs the real 'caddy adapt' of
// bin/caddy on every example: what users run must give the goldens too.
func TestExamplesAdaptWithCaddyBinary(t *testing.T) {
	caddy := testenv.Bin(t, "caddy")
	for _, f := range examples(t) {
		t.Run(f, func(t *testing.T) {
			cmd := exec.Command(caddy, "adapt", "--config", f, "--adapter", "caddyfile")
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "GRID_REDIS=") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("caddy adapt %s: %v\n%s", f, err, stderr.String())
			}
			want, err := os.ReadFile(golden(f))
			if err != nil {
				t.Fatal(err)
			}
			if got := indent(bytes.TrimSpace(out)); !bytes.Equal(got, want) {
				t.Errorf("bin/caddy adapt %s does not give %s:\n%s", f, golden(f), firstDiff(string(want), string(got)))
			}
		})
	}
}

// firstDiff shows the first differing line with a little context.
func firstDiff(want, got string) string {
	wl, gl := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(wl) || i < len(gl); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			return fmt.Sprintf("line %d:\n  want: %s\n  got:  %s", i+1, w, g)
		}
	}
	return "(no line differs; whitespace at the end)"
}

// TestBadCaddyfiles checks that every bad option fails at adapt time with
// the line of the option and a message that names it.
func TestBadCaddyfiles(t *testing.T) {
	site := func(body string) string {
		return ":8080 {\n\tbrowser_grid chromium {\n" + body + "\n\t}\n}\n"
	}
	global := func(body string) string {
		return "{\n\tgrid {\n" + body + "\n\t}\n}\n:8080 {\n\tbrowser_grid chromium\n}\n"
	}
	proxy := func(body string) string {
		return ":8080 {\n\treverse_proxy {\n\t\tdynamic browser_grid chromium\n" + body + "\n\t}\n}\n"
	}
	cases := []struct {
		name      string
		caddyfile string
		line      int
		want      string
	}{
		{"unknown option", site("\t\tmax_lifetimes 5"), 3, "unrecognized subdirective 'max_lifetimes'"},
		{"max_lifetime not a number", site("\t\tmax_lifetime ten"), 3, "invalid max_lifetime 'ten'"},
		{"max_lifetime negative", site("\t\tmax_lifetime -1"), 3, "invalid max_lifetime '-1'"},
		{"max_concurrent negative", site("\t\tmax_concurrent -2"), 3, "invalid max_concurrent '-2'"},
		{"max_concurrent missing value", site("\t\tmax_concurrent"), 3, "wrong argument count"},
		{"max_lifetime twice", site("\t\tmax_lifetime 5\n\t\tmax_lifetime 6"), 4, "max_lifetime already specified"},
		{"select_timeout not a duration", site("\t\tselect_timeout soon"), 3, "invalid select_timeout 'soon'"},
		{"select_timeout zero", site("\t\tselect_timeout 0s"), 3, "invalid select_timeout '0s'"},
		{"queue_size zero", site("\t\tqueue_size 0"), 3, "invalid queue_size '0'"},
		{"stagger_drains not on or off", site("\t\tstagger_drains maybe"), 3, "invalid stagger_drains 'maybe'"},
		{"version_routing not on or off", site("\t\tversion_routing sometimes"), 3, "invalid version_routing 'sometimes'"},
		{"version_routing twice", site("\t\tversion_routing on\n\t\tversion_routing off"), 4, "version_routing already specified"},
		{"version_routing extra argument", site("\t\tversion_routing on off"), 3, "wrong argument count"},
		{"version_routing in lb_policy not on or off", proxy("\t\tlb_policy lifetime_first {\n\t\t\tversion_routing no\n\t\t}"), 5, "invalid version_routing 'no'"},
		{"max_session negative", site("\t\tmax_session -5m"), 3, "invalid max_session '-5m'"},
		{"dial_retries too many", site("\t\tdial_retries 11"), 3, "invalid dial_retries '11'"},
		{"upgrade_timeout extra argument", site("\t\tupgrade_timeout 5s 6s"), 3, "wrong argument count"},
		{"max_scan outside vnode", site("\t\tmax_scan 8"), 3, "max_scan is an option of the vnode policy"},
		{"unknown policy", site("\t\tpolicy round_robin"), 3, "unrecognized policy 'round_robin'"},
		{"policy twice", site("\t\tpolicy vnode\n\t\tpolicy fair_share"), 4, "policy already specified"},
		{"vnode virtual_nodes too many", site("\t\tpolicy vnode {\n\t\t\tvirtual_nodes 100\n\t\t}"), 4, "invalid virtual_nodes '100'"},
		{"vnode samples zero", site("\t\tpolicy vnode {\n\t\t\tsamples 0\n\t\t}"), 4, "invalid samples '0'"},
		{"vnode slot_jitter too big", site("\t\tpolicy vnode {\n\t\t\tslot_jitter 65\n\t\t}"), 4, "invalid slot_jitter '65'"},
		{"vnode max_scan too big", site("\t\tpolicy vnode {\n\t\t\tmax_scan 300\n\t\t}"), 4, "invalid max_scan '300'"},
		{"vnode unknown option", site("\t\tpolicy vnode {\n\t\t\tpivots 3\n\t\t}"), 4, "unrecognized vnode option 'pivots'"},
		{"vnode shared option inside the policy block", site("\t\tpolicy vnode {\n\t\t\tmax_lifetime 3\n\t\t}"), 4, "unrecognized vnode option 'max_lifetime'"},
		{"fair_share window zero", site("\t\tpolicy fair_share {\n\t\t\twindow 0\n\t\t}"), 4, "invalid window '0'"},
		{"fair_share default_estimate below a millisecond", site("\t\tpolicy fair_share {\n\t\t\tdefault_estimate 1500us\n\t\t}"), 4, "invalid default_estimate '1500us'"},
		{"fair_share median with a value", site("\t\tpolicy fair_share {\n\t\t\tmedian yes\n\t\t}"), 4, "wrong argument count"},
		{"client_limit zero", site("\t\tclient_limit 0"), 3, "invalid client_limit '0'"},
		{"client_limit negative", site("\t\tclient_limit -1"), 3, "invalid client_limit '-1'"},
		{"client_limit not a whole number", site("\t\tclient_limit 2.5"), 3, "invalid client_limit '2.5'"},
		{"client_limit missing value", site("\t\tclient_limit"), 3, "wrong argument count"},
		{"client_key empty", site("\t\tclient_limit 2\n\t\tclient_key \"\""), 4, "invalid client_key ''"},
		{"client_key without client_limit", site("\t\tmax_concurrent 2\n\t\tclient_key {http.auth.user.id}"), 4, "client_key needs client_limit"},
		{"client_key twice", site("\t\tclient_limit 2\n\t\tclient_key {http.auth.user.id}\n\t\tclient_key {http.vars.client_ip}"), 5, "client_key already specified"},
		{"client_key without a placeholder", site("\t\tclient_limit 2\n\t\tclient_key X-Client"), 4, "invalid client_key 'X-Client': no placeholder"},
		{"lb_policy client_key without a placeholder", proxy("\t\tlb_policy lifetime_first {\n\t\t\tclient_limit 2\n\t\t\tclient_key user\n\t\t}"), 6, "invalid client_key 'user': no placeholder"},
		{"lb_policy client_limit zero", proxy("\t\tlb_policy lifetime_first {\n\t\t\tclient_limit 0\n\t\t}"), 5, "invalid client_limit '0'"},
		{"lb_policy client_key without client_limit", proxy("\t\tlb_policy vnode {\n\t\t\tclient_key {http.auth.user.id}\n\t\t}"), 5, "client_key needs client_limit"},
		{"bad pool name", ":8080 {\n\tbrowser_grid chrom/ium\n}\n", 2, "invalid pool name 'chrom/ium'"},
		{"two pools", ":8080 {\n\tbrowser_grid chromium firefox\n}\n", 2, "wrong argument count"},
		{"bad browsers name", site("\t\tbrowsers chromium fire*fox"), 3, "invalid browsers pool name 'fire*fox'"},
		{"pool not in browsers", site("\t\tbrowsers firefox webkit"), 3, "pool 'chromium' is not in browsers"},
		{"grid unknown option", global("\t\thost 127.0.0.1"), 3, "unrecognized grid option 'host'"},
		{"grid redis not a URL", global("\t\tredis 127.0.0.1:6379"), 3, "invalid redis '127.0.0.1:6379'"},
		{"grid lease_ttl too short", global("\t\tlease_ttl 500ms"), 3, "invalid lease_ttl '500ms'"},
		{"grid stale_threshold not a duration", global("\t\tstale_threshold often"), 3, "invalid stale_threshold 'often'"},
		{"grid reaper_interval zero", global("\t\treaper_interval 0s"), 3, "invalid reaper_interval '0s'"},
		{"grid prefix with a colon", global("\t\tprefix a:b"), 3, "invalid prefix 'a:b'"},
		{"grid max_batch zero", global("\t\tmax_batch 0"), 3, "invalid max_batch '0': want a whole number from 1 to 256"},
		{"grid max_batch too big", global("\t\tmax_batch 257"), 3, "invalid max_batch '257'"},
		{"grid max_batch not a number", global("\t\tmax_batch many"), 3, "invalid max_batch 'many'"},
		{"grid redis twice", global("\t\tredis redis://a:1\n\t\tredis redis://b:2"), 4, "redis already specified"},
		{"grid worker_networks bad prefix length", global("\t\tworker_networks 10.0.0.0/8 10.0.0.0/33"), 3, "invalid worker_networks '10.0.0.0/33'"},
		{"grid worker_networks a name", global("\t\tworker_networks intranet"), 3, "invalid worker_networks 'intranet'"},
		{"grid worker_networks empty", global("\t\tworker_networks"), 3, "wrong argument count"},
		{"grid worker_networks twice", global("\t\tworker_networks 10.0.0.0/8\n\t\tworker_networks ::1"), 4, "worker_networks already specified"},
		{"grid allow_unix_workers with a value", global("\t\tallow_unix_workers yes"), 3, "wrong argument count"},
		{"grid worker_secret missing", global("\t\tworker_secret"), 3, "wrong argument count"},
		{"lb_policy unknown option", proxy("\t\tlb_policy lifetime_first {\n\t\t\tmax_lifetimes 3\n\t\t}"), 5, "unrecognized lifetime_first option 'max_lifetimes'"},
		{"lb_policy vnode samples too many", proxy("\t\tlb_policy vnode {\n\t\t\tsamples 9\n\t\t}"), 5, "invalid samples '9'"},
		{"lb_policy max_scan zero", proxy("\t\tlb_policy fair_share {\n\t\t\tmax_scan 0\n\t\t}"), 5, "invalid max_scan '0'"},
		{"dynamic browser_grid unknown option", ":8080 {\n\treverse_proxy {\n\t\tdynamic browser_grid chromium {\n\t\t\tpools a\n\t\t}\n\t}\n}\n", 4, "unrecognized browser_grid upstreams option 'pools'"},
		{"dynamic browser_grid bad pool", ":8080 {\n\treverse_proxy {\n\t\tdynamic browser_grid chro:mium\n\t}\n}\n", 3, "invalid pool name 'chro:mium'"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := adapt("Caddyfile", []byte(tc.caddyfile))
			if err == nil {
				t.Fatalf("adapting succeeded; want an error naming %q at line %d:\n%s", tc.want, tc.line, tc.caddyfile)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error does not name the bad option:\n  got:  %s\n  want: …%s…", msg, tc.want)
			}
			if at := fmt.Sprintf("Caddyfile:%d", tc.line); !strings.Contains(msg, at) {
				t.Errorf("error does not point at line %d:\n  got: %s", tc.line, msg)
			}
		})
	}
}
