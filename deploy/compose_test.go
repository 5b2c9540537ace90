package deploy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
)

// loadCompose loads compose.yaml as `docker compose` does (compose-go is
// its loader): interpolation, merge keys, and validation against the
// Compose specification's schema, where an unknown key fails.
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	details := types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(dir, "compose.yaml")}},
		// compose.yaml refuses to start without the shared secret.
		Environment: types.Mapping{"GRID_WORKER_SECRET": "deploy-check-only"},
	}
	p, err := loader.LoadWithContext(context.Background(), details, func(o *loader.Options) {
		o.SetProjectName("browser-grid", true)
	})
	if err != nil {
		t.Fatalf("loading compose.yaml: %v", err)
	}
	return p
}

func TestComposeNeedsTheSecret(t *testing.T) {
	dir, _ := filepath.Abs(".")
	_, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(dir, "compose.yaml")}},
		Environment: types.Mapping{},
	}, func(o *loader.Options) { o.SetProjectName("browser-grid", true) })
	if err == nil || !strings.Contains(err.Error(), "GRID_WORKER_SECRET") {
		t.Errorf("compose.yaml loaded without GRID_WORKER_SECRET (err %v)", err)
	}
}

func TestCompose(t *testing.T) {
	help := gridWorkerHelp(t)
	p := loadCompose(t)

	var redis, caddies, workers []string
	adapted := map[string]bool{} // Caddyfiles, by path: both Caddy services mount the same one
	for name, s := range p.Services {
		if s.Restart != types.RestartPolicyUnlessStopped {
			t.Errorf("service %s: restart %q, want %q", name, s.Restart, types.RestartPolicyUnlessStopped)
		}
		dockerfile := ""
		if s.Build != nil {
			dockerfile = s.Build.Dockerfile
			// The build context is the repository root, which holds go.mod.
			if _, err := os.Stat(filepath.Join(s.Build.Context, "go.mod")); err != nil {
				t.Errorf("service %s: build context %s is not the repository root: %v", name, s.Build.Context, err)
			}
			if _, err := os.Stat(filepath.Join(s.Build.Context, dockerfile)); err != nil {
				t.Errorf("service %s: %v", name, err)
			}
		}
		switch {
		case strings.HasPrefix(s.Image, "redis:"):
			redis = append(redis, name)
		case dockerfile == "deploy/caddy.Dockerfile":
			caddies = append(caddies, name)
			checkComposeCaddy(t, name, s, adapted)
		case dockerfile == "deploy/worker.Dockerfile":
			workers = append(workers, name)
			checkComposeWorker(t, help, name, s)
		default:
			t.Errorf("service %s: neither Redis, Caddy nor a worker", name)
		}
	}
	if len(redis) != 1 || len(caddies) != 2 || len(workers) != 3 {
		t.Errorf("services: redis %v, caddy %v, workers %v; want one Redis, two Caddy, three workers", redis, caddies, workers)
	}
}

func checkComposeCaddy(t *testing.T, name string, s types.ServiceConfig, adapted map[string]bool) {
	t.Helper()
	mounted := false
	for _, v := range s.Volumes {
		if v.Target != "/etc/caddy/Caddyfile" {
			continue
		}
		mounted = true
		if adapted[v.Source] {
			continue
		}
		adapted[v.Source] = true
		text, err := os.ReadFile(v.Source)
		if err != nil {
			t.Errorf("service %s mounts %s: %v", name, v.Source, err)
			continue
		}
		adaptCaddyfile(t, "service "+name+": "+filepath.Base(v.Source), string(text))
	}
	if !mounted {
		t.Errorf("service %s mounts no Caddyfile at /etc/caddy/Caddyfile (the image's CMD reads it)", name)
	}
}

func checkComposeWorker(t *testing.T, help workerHelp, name string, s types.ServiceConfig) {
	t.Helper()
	env := map[string]string{}
	var names []string
	for k, v := range s.Environment {
		names = append(names, k)
		if v != nil {
			env[k] = *v
		}
	}
	help.checkEnv(t, "service "+name, names)
	for _, a := range append(append([]string{}, s.Entrypoint...), s.Command...) {
		if f, ok := strings.CutPrefix(a, "-"); ok {
			f, _, _ = strings.Cut(strings.TrimPrefix(f, "-"), "=")
			if !help.flags[f] {
				t.Errorf("service %s: flag %s is not a grid-worker flag", name, a)
			}
		}
	}
	if s.StopGracePeriod == nil {
		t.Errorf("service %s: no stop_grace_period (Docker's default 10s is shorter than any drain)", name)
	} else {
		help.checkStopGrace(t, "service "+name, "stop_grace_period", time.Duration(*s.StopGracePeriod), env, append(append([]string{}, s.Entrypoint...), s.Command...))
	}
	if s.ShmSize < 256<<20 {
		t.Errorf("service %s: shm_size %d; Chromium needs more than Docker's 64 MB /dev/shm", name, s.ShmSize)
	}
}

// TestComposePublishesOnLoopback: the compose grid serves anonymous
// browser sessions (no authentication, no client_limit) and its metrics;
// Docker publishes a port without a host address on every interface of the
// host, past the host's firewall rules, so anyone who reaches the host
// would get browsers. Every published port binds to the loopback.
func TestComposePublishesOnLoopback(t *testing.T) {
	p := loadCompose(t)
	published := 0
	for name, s := range p.Services {
		for _, port := range s.Ports {
			if port.Published == "" {
				continue
			}
			published++
			if port.HostIP != "127.0.0.1" && port.HostIP != "::1" {
				t.Errorf("service %s publishes port %s on host address %q (every interface); want 127.0.0.1:%s:%d", name, port.Published, port.HostIP, port.Published, port.Target)
			}
		}
	}
	if published == 0 {
		t.Error("no published port: the test proves nothing")
	}
}
