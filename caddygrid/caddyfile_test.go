package caddygrid_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// An operator whose Caddyfile has a mistake in a grid option gets, from
// 'caddy adapt' (and so from 'caddy run' and 'caddy reload'), an error
// that names the option and the file's line, and a non-zero exit.
func TestCaddyfileMistakesNameTheOptionAndTheLine(t *testing.T) {
	t.Parallel()
	bin := testenv.Bin(t, "caddy")
	for _, tc := range []struct {
		name string
		// src is the Caddyfile; the mistake is on the first line holding
		// line, and the error must contain says.
		src, line, says string
	}{
		{"unknown handler option", handlerBlock("max_concurrent 2\nmax_concurent 3"), "max_concurent", "max_concurent"},
		{"bad duration", handlerBlock("max_session 5parsecs"), "max_session", "max_session"},
		{"zero duration", handlerBlock("select_timeout 0s"), "select_timeout", "select_timeout"},
		{"bad policy name", handlerBlock("policy round_robin"), "policy", "round_robin"},
		{"negative max_concurrent", handlerBlock("max_concurrent -1"), "max_concurrent", "max_concurrent"},
		{"max_concurrent not a number", handlerBlock("max_concurrent two"), "max_concurrent", "max_concurrent"},
		{"dial_retries out of range", handlerBlock("dial_retries 11"), "dial_retries", "dial_retries"},
		{"launch_args with a flag that writes a file", handlerBlock("launch_args --accept-lang --log-net-log"), "launch_args", "--log-net-log is not a flag the grid passes"},
		{"launch_args with a value", handlerBlock("launch_args --lang=de"), "launch_args", "no flag name"},
		{"repeated option", handlerBlock("max_lifetime 5\nmax_lifetime 6"), "max_lifetime 6", "max_lifetime"},
		{"option of another policy", handlerBlock("policy lifetime_first\nsamples 2"), "samples", "samples"},
		{"block after policy", handlerBlock("policy vnode {\nsamples 2\n}"), "samples", "policy"},
		{"client_key without client_limit", handlerBlock("client_key {http.request.header.X-User}"), "client_key", "client_key"},
		{"client_key without placeholder", handlerBlock("client_limit 2\nclient_key everyone"), "client_key", "client_key"},
		{"bad stagger_drains", handlerBlock("max_lifetime 5\nstagger_drains maybe"), "stagger_drains", "stagger_drains"},
		{"bad pool name", "http://localhost {\n\tbrowser_grid chrom/ium\n}\n", "browser_grid", "chrom/ium"},
		{"unknown option in a policy block", `http://localhost {
	reverse_proxy {
		dynamic browser_grid
		transport browser_grid
		lb_policy vnode {
			samples 2
			bogus 3
		}
	}
}
`, "bogus", "bogus"},
		{"policy block option of another policy", `http://localhost {
	reverse_proxy {
		dynamic browser_grid
		transport browser_grid
		lb_policy fair_share {
			slot_jitter 2
		}
	}
}
`, "slot_jitter", "slot_jitter"},
		{"unknown transport option", `http://localhost {
	reverse_proxy {
		dynamic browser_grid
		lb_policy lifetime_first
		transport browser_grid {
			dial_timeout 1s
			read_timeout 2s
		}
	}
}
`, "read_timeout", "read_timeout"},
		{"bad transport duration", `http://localhost {
	reverse_proxy {
		dynamic browser_grid
		lb_policy lifetime_first
		transport browser_grid {
			upgrade_timeout forever
		}
	}
}
`, "upgrade_timeout", "upgrade_timeout"},
		{"unknown upstreams option", `http://localhost {
	reverse_proxy {
		dynamic browser_grid {
			pools chromium
		}
		lb_policy lifetime_first
		transport browser_grid
	}
}
`, "pools", "pools"},
		{"unknown grid option", "{\n\tgrid {\n\t\tredis redis://127.0.0.1:6379\n\t\tredis_pool 4\n\t}\n}\n" + handlerBlock(""), "redis_pool", "redis_pool"},
		{"bad stale_threshold", "{\n\tgrid {\n\t\tstale_threshold soon\n\t}\n}\n" + handlerBlock(""), "stale_threshold", "stale_threshold"},
		{"bad worker_networks", "{\n\tgrid {\n\t\tworker_networks 10.0.0.0/33\n\t}\n}\n" + handlerBlock(""), "worker_networks", "worker_networks"},
		{"bad prefix", "{\n\tgrid {\n\t\tprefix {grid}\n\t}\n}\n" + handlerBlock(""), "prefix", "prefix"},
		{"max_lifetime negative", handlerBlock("max_lifetime -1"), "max_lifetime", "invalid max_lifetime '-1'"},
		{"max_concurrent without a value", handlerBlock("max_concurrent"), "max_concurrent", "wrong argument count"},
		{"queue_size zero", handlerBlock("queue_size 0"), "queue_size", "invalid queue_size '0'"},
		{"version_routing not on or off", handlerBlock("version_routing sometimes"), "version_routing", "invalid version_routing 'sometimes'"},
		{"max_session negative", handlerBlock("max_session -5m"), "max_session", "invalid max_session '-5m'"},
		{"upgrade_timeout with two values", handlerBlock("upgrade_timeout 5s 6s"), "upgrade_timeout", "wrong argument count"},
		{"policy twice", handlerBlock("policy vnode\npolicy fair_share"), "policy fair_share", "policy already specified"},
		{"vnode samples zero", handlerBlock("policy vnode\nsamples 0"), "samples", "invalid samples '0'"},
		{"vnode slot_jitter too big", handlerBlock("policy vnode\nslot_jitter 65"), "slot_jitter", "invalid slot_jitter '65'"},
		{"max_scan too big", handlerBlock("max_scan 300"), "max_scan", "invalid max_scan '300'"},
		{"fair_share window zero", handlerBlock("policy fair_share\nwindow 0"), "window", "invalid window '0'"},
		{"fair_share default_estimate below a millisecond", handlerBlock("policy fair_share\ndefault_estimate 1500us"), "default_estimate", "must be whole milliseconds"},
		{"fair_share median with a value", handlerBlock("policy fair_share\nmedian yes"), "median", "wrong argument count"},
		{"client_limit zero", handlerBlock("client_limit 0"), "client_limit", "invalid client_limit '0'"},
		{"client_limit not a whole number", handlerBlock("client_limit 2.5"), "client_limit", "invalid client_limit '2.5'"},
		{"client_key twice", handlerBlock("client_limit 2\nclient_key {http.auth.user.id}\nclient_key {http.vars.client_ip}"), "client_key {http.vars.client_ip}", "client_key already specified"},
		{"two pools", "http://localhost {\n\tbrowser_grid chromium firefox\n}\n", "browser_grid", "wrong argument count"},
		{"bad browsers name", handlerBlock("browsers chromium fire*fox"), "browsers", "invalid browsers pool name 'fire*fox'"},
		{"pool not in browsers", "http://localhost {\n\tbrowser_grid chromium {\n\t\tbrowsers firefox webkit\n\t}\n}\n", "browsers", "pool 'chromium' is not in browsers"},
		{"lb_policy client_key without a placeholder", "http://localhost {\n\treverse_proxy {\n\t\tdynamic browser_grid\n\t\tlb_policy lifetime_first {\n\t\t\tclient_limit 2\n\t\t\tclient_key user\n\t\t}\n\t}\n}\n", "client_key", "invalid client_key 'user'"},
		{"lb_policy vnode samples too many", "http://localhost {\n\treverse_proxy {\n\t\tdynamic browser_grid\n\t\tlb_policy vnode {\n\t\t\tsamples 9\n\t\t}\n\t}\n}\n", "samples", "invalid samples '9'"},
		{"dynamic browser_grid bad pool", "http://localhost {\n\treverse_proxy {\n\t\tdynamic browser_grid chro:mium\n\t}\n}\n", "dynamic", "invalid pool name 'chro:mium'"},
		{"grid redis not a URL", "{\n\tgrid {\n\t\tredis 127.0.0.1:6379\n\t}\n}\n" + handlerBlock(""), "redis", "invalid redis '127.0.0.1:6379'"},
		{"grid redis twice", "{\n\tgrid {\n\t\tredis redis://a:1\n\t\tredis redis://b:2\n\t}\n}\n" + handlerBlock(""), "redis://b:2", "redis already specified"},
		{"grid reaper_interval zero", "{\n\tgrid {\n\t\treaper_interval 0s\n\t}\n}\n" + handlerBlock(""), "reaper_interval", "invalid reaper_interval '0s'"},
		{"grid prefix with a colon", "{\n\tgrid {\n\t\tprefix a:b\n\t}\n}\n" + handlerBlock(""), "prefix", "invalid prefix 'a:b'"},
		{"grid worker_networks a name", "{\n\tgrid {\n\t\tworker_networks intranet\n\t}\n}\n" + handlerBlock(""), "worker_networks", "invalid worker_networks 'intranet'"},
		{"grid worker_secret without a value", "{\n\tgrid {\n\t\tworker_secret\n\t}\n}\n" + handlerBlock(""), "worker_secret", "wrong argument count"},
		{"unknown UI option", "http://localhost {\n\tbrowser_grid_ui {\n\t\tinterval 2s\n\t\tcolour red\n\t}\n}\n", "colour", "colour"},
		{"bad UI interval", "http://localhost {\n\tbrowser_grid_ui {\n\t\tinterval 0s\n\t}\n}\n", "interval", "interval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			line := 0
			for i, l := range strings.Split(tc.src, "\n") {
				if strings.Contains(l, tc.line) {
					line = i + 1
					break
				}
			}
			if line == 0 {
				t.Fatalf("the case's Caddyfile has no line holding %q", tc.line)
			}
			dir := t.TempDir()
			file := filepath.Join(dir, "Caddyfile")
			if err := os.WriteFile(file, []byte(tc.src), 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "adapt", "--config", file, "--adapter", "caddyfile")
			cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("caddy adapt accepted it:\n%s\n%s", tc.src, out)
			}
			where := fmt.Sprintf("Caddyfile:%d", line)
			if !strings.Contains(string(out), where) || !strings.Contains(string(out), tc.says) {
				t.Errorf("caddy adapt: %s\nwant an error naming %q at %s", strings.TrimSpace(string(out)), tc.says, where)
			}
		})
	}
}

// handlerBlock is a site with one browser_grid directive holding the
// options, one a line.
func handlerBlock(options string) string {
	var b strings.Builder
	b.WriteString("http://localhost {\n\tbrowser_grid {\n")
	for _, o := range strings.Split(options, "\n") {
		if o != "" {
			b.WriteString("\t\t" + o + "\n")
		}
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}
