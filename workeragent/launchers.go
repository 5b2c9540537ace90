package workeragent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"go.uber.org/zap"
)

// ChromiumFlags are the flags every Chromium the agent starts gets: they
// keep it working on a machine without internet access (DESIGN.md, "Real
// parts"); without them Chromium keeps dialing Google's services.
var ChromiumFlags = []string{
	"--headless",
	"--no-sandbox",
	"--disable-gpu",
	"--disable-background-networking",
	"--disable-component-update",
	"--disable-sync",
	"--no-first-run",
}

// DefaultChromium is Debian's Chromium.
const DefaultChromium = "/usr/bin/chromium"

// LaunchFunc starts one browser server.
type LaunchFunc func(ctx context.Context) (*Browser, error)

// NewLauncher returns the launch function cfg.Launcher names. It resolves
// the files it needs (node script, fakebrowser, Chromium) now, so a missing
// part is reported before anything starts.
func NewLauncher(cfg Config, log *zap.Logger) (LaunchFunc, error) {
	// The browser listens on loopback only: every session reaches it
	// through the agent.
	cfg.Host, cfg.Port = "127.0.0.1", 0
	switch cfg.Launcher {
	case LauncherPlaywright, LauncherPlaywrightServer:
		return playwrightLauncher(cfg, log)
	case LauncherCDP:
		return cdpLauncher(cfg, log)
	case LauncherExec:
		return execLauncher(cfg, log), nil
	case LauncherFake:
		return fakeLauncher(cfg, log)
	}
	return nil, fmt.Errorf("unknown launcher %q", cfg.Launcher)
}

// exeDir is the directory of the running binary.
func exeDir() string {
	p, err := os.Executable()
	if err != nil {
		return ""
	}
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r
	}
	return filepath.Dir(p)
}

// findLaunchScript finds playwright/launch-server.mjs: where the flag says,
// else in $GRID_PLAYWRIGHT_DIR, beside the binary (bin/../playwright,
// ./playwright) or in the working directory.
func findLaunchScript(flagValue string) (string, error) {
	if flagValue != "" {
		if _, err := os.Stat(flagValue); err != nil {
			return "", fmt.Errorf("launch script: %w", err)
		}
		return filepath.Abs(flagValue)
	}
	var tried []string
	dirs := []string{}
	// The local grid (internal/localgrid) names the folder this way.
	if d := os.Getenv("GRID_PLAYWRIGHT_DIR"); d != "" {
		dirs = append(dirs, d)
	}
	if d := exeDir(); d != "" {
		dirs = append(dirs, filepath.Join(d, "..", "playwright"), filepath.Join(d, "playwright"))
	}
	if wd, err := os.Getwd(); err == nil {
		dirs = append(dirs, filepath.Join(wd, "playwright"))
	}
	for _, d := range dirs {
		p := filepath.Join(d, "launch-server.mjs")
		tried = append(tried, p)
		if _, err := os.Stat(p); err == nil {
			return filepath.Clean(p), nil
		}
	}
	return "", fmt.Errorf("playwright/launch-server.mjs not found (tried %s); set -launch-script", strings.Join(tried, ", "))
}

func playwrightLauncher(cfg Config, log *zap.Logger) (LaunchFunc, error) {
	script, err := findLaunchScript(cfg.LaunchScript)
	if err != nil {
		return nil, err
	}
	node, err := exec.LookPath(cfg.Node)
	if err != nil {
		return nil, fmt.Errorf("the playwright launchers need node: %w", err)
	}
	exe := cfg.Executable
	if exe == "" && cfg.BrowserType == "chromium" {
		exe = DefaultChromium
	}
	if exe != "" {
		if _, err := os.Stat(exe); err != nil {
			return nil, fmt.Errorf("browser executable: %w", err)
		}
	}
	ffmpeg := ""
	if cfg.FFmpeg != "none" {
		if ffmpeg, err = exec.LookPath(cfg.FFmpeg); err != nil {
			log.Warn("no ffmpeg: this worker's sessions cannot record video (install Debian's ffmpeg, or set -ffmpeg)",
				zap.String("ffmpeg", cfg.FFmpeg))
			ffmpeg = ""
		}
	}
	shell := headlessShell(cfg)
	if shell != "" {
		found, err := exec.LookPath(shell)
		if err != nil {
			log.Info("no headless shell: headless browsers run on the full Chromium, which starts slower (install Debian's chromium-headless-shell, or set -headless-shell)",
				zap.String("headless_shell", shell))
		}
		shell = found
	}
	mode := "shared"
	if cfg.Launcher == LauncherPlaywrightServer {
		mode = "per-session"
	}
	args := []string{script, "--browser", cfg.BrowserType, "--host", cfg.Host, "--port", strconv.Itoa(cfg.Port), "--ws-path", cfg.WSPath, "--mode", mode}
	if exe != "" {
		args = append(args, "--executable", exe)
	}
	if shell != "" {
		args = append(args, "--headless-shell", shell)
	}
	if ffmpeg != "" {
		args = append(args, "--ffmpeg", ffmpeg)
	}
	if cfg.PlaywrightVersion != "" {
		args = append(args, "--playwright-version", cfg.PlaywrightVersion)
	}
	return func(ctx context.Context) (*Browser, error) {
		// Each browser's own folder: the links to the system's browser
		// and ffmpeg where playwright-core looks, and its temporary files
		// (videos, traces, downloads), removed with it.
		dir, err := os.MkdirTemp("", "grid-worker-browser-")
		if err != nil {
			return nil, fmt.Errorf("creating the browser's folder: %w", err)
		}
		tmp := filepath.Join(dir, "tmp")
		if err := os.Mkdir(tmp, 0o700); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		return startProcess(ctx, log, startOptions{
			name:    node,
			args:    append(append([]string(nil), args...), "--browsers-dir", dir),
			env:     []string{"TMPDIR=" + tmp},
			timeout: cfg.StartTimeout,
			// Playwright's server answers plain HTTP requests with "Running".
			probe:   func(u *url.URL) probe { return probe{httpURL: "http://" + dialAddr(u) + "/"} },
			cleanup: []func(){func() { os.RemoveAll(dir) }},
			dir:     tmp,
			flags:   mode == "per-session",
		})
	}, nil
}

// headlessShell is the headless shell the playwright launchers look for
// ("" none): the one named, else Debian's unless the operator named a
// browser of their own.
func headlessShell(cfg Config) string {
	switch {
	case cfg.BrowserType != "chromium" || cfg.HeadlessShell == "none":
		return ""
	case cfg.HeadlessShell != "":
		return cfg.HeadlessShell
	case cfg.Executable != "":
		return ""
	}
	return "chromium-headless-shell"
}

func cdpLauncher(cfg Config, log *zap.Logger) (LaunchFunc, error) {
	exe := cfg.Executable
	if exe == "" {
		exe = DefaultChromium
	}
	if _, err := exec.LookPath(exe); err != nil {
		return nil, fmt.Errorf("the cdp launcher needs Chromium: %w", err)
	}
	return func(ctx context.Context) (*Browser, error) {
		// A fresh profile for every launch: nothing carries over from the
		// previous browser's sessions.
		dir, err := os.MkdirTemp("", "grid-worker-cdp-")
		if err != nil {
			return nil, fmt.Errorf("creating the browser profile directory: %w", err)
		}
		args := append(append([]string(nil), ChromiumFlags...),
			"--remote-debugging-address="+cfg.Host,
			"--remote-debugging-port="+strconv.Itoa(cfg.Port),
			"--user-data-dir="+dir,
			"about:blank",
		)
		// Chromium prints "DevTools listening on ws://HOST:PORT/devtools/browser/<id>"
		// on stderr; that path is what clients (and the grid) connect to.
		return startProcess(ctx, log, startOptions{
			name:    exe,
			args:    args,
			timeout: cfg.StartTimeout,
			probe: func(u *url.URL) probe {
				return probe{httpURL: "http://" + dialAddr(u) + "/json/version"}
			},
			cleanup: []func(){func() { os.RemoveAll(dir) }},
		})
	}, nil
}

func execLauncher(cfg Config, log *zap.Logger) LaunchFunc {
	return func(ctx context.Context) (*Browser, error) {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		return startProcess(ctx, log, startOptions{
			name: "/bin/sh",
			args: []string{"-c", cfg.Exec},
			env: []string{
				"BROWSER_TYPE=" + cfg.BrowserType,
				"BROWSER_HOST=" + cfg.Host,
				"BROWSER_PORT=" + strconv.Itoa(port),
				"WS_PATH=" + cfg.WSPath,
				"BROWSER_EXECUTABLE=" + cfg.Executable,
			},
			timeout: cfg.StartTimeout,
			probe:   func(u *url.URL) probe { return probe{addr: dialAddr(u)} },
		})
	}
}

// findFakebrowser looks beside the grid-worker binary, then on PATH.
func findFakebrowser(flagValue string) (string, error) {
	if flagValue != "" {
		return exec.LookPath(flagValue)
	}
	if d := exeDir(); d != "" {
		p := filepath.Join(d, "fakebrowser")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	p, err := exec.LookPath("fakebrowser")
	if err != nil {
		return "", errors.New("fakebrowser not found beside grid-worker nor on PATH; set -fakebrowser")
	}
	return p, nil
}

func fakeLauncher(cfg Config, log *zap.Logger) (LaunchFunc, error) {
	bin, err := findFakebrowser(cfg.Fakebrowser)
	if err != nil {
		return nil, err
	}
	args := []string{"-addr", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)), "-path", cfg.WSPath}
	args = append(args, strings.Fields(cfg.FakeArgs)...)
	return func(ctx context.Context) (*Browser, error) {
		// A folder of its own, as a real browser's: what it holds counts
		// against -disk-max.
		dir, err := os.MkdirTemp("", "grid-worker-browser-")
		if err != nil {
			return nil, fmt.Errorf("creating the browser's folder: %w", err)
		}
		return startProcess(ctx, log, startOptions{
			name:    bin,
			args:    args,
			env:     []string{"TMPDIR=" + dir},
			timeout: cfg.StartTimeout,
			probe:   func(u *url.URL) probe { return probe{httpURL: "http://" + dialAddr(u) + "/health"} },
			cleanup: []func(){func() { os.RemoveAll(dir) }},
			dir:     dir,
		})
	}, nil
}

// freePort asks the kernel for a free loopback port, for a command that
// needs its port named.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port for the browser: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
