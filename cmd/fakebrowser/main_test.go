package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

var binPath string

// TestMain builds this command once for the tests that run it as a process.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fakebrowser-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "fakebrowser")
	if out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building fakebrowser: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// startBin runs the binary and returns it with the endpoints it printed.
func startBin(t *testing.T, n int, args ...string) (*exec.Cmd, []string, *strings.Builder) {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &strings.Builder{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		io.Copy(io.Discard, stdout)
	}()
	var eps []string
	timeout := time.After(10 * time.Second)
	for len(eps) < n {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("fakebrowser printed %d endpoints, want %d; stderr: %s", len(eps), n, stderr)
			}
			eps = append(eps, l)
		case <-timeout:
			t.Fatalf("fakebrowser printed %d endpoints in 10s, want %d", len(eps), n)
		}
	}
	return cmd, eps, stderr
}

func exitCode(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		return cmd.ProcessState.ExitCode()
	case <-time.After(10 * time.Second):
		t.Fatal("fakebrowser did not exit")
		return -1
	}
}

func TestPrintsEndpointsAndEchoes(t *testing.T) {
	cmd, eps, _ := startBin(t, 3, "-count", "3", "-path", "/devtools/browser/abc")
	seen := map[string]bool{}
	for _, ep := range eps {
		if !strings.HasPrefix(ep, "ws://127.0.0.1:") || !strings.HasSuffix(ep, "/devtools/browser/abc") || seen[ep] {
			t.Fatalf("endpoints %q", eps)
		}
		seen[ep] = true
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, _, err := websocket.Dial(ctx, ep, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
			t.Fatal(err)
		}
		if _, msg, err := c.Read(ctx); err != nil || string(msg) != "hi" {
			t.Fatalf("echo from %s: %q %v", ep, msg, err)
		}
		c.Close(websocket.StatusNormalClosure, "")
		cancel()
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if code := exitCode(t, cmd); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0", code)
	}
}

func TestCrashExitCode(t *testing.T) {
	cmd, eps, _ := startBin(t, 1, "-crash-on-session", "1")
	c, _, err := websocket.Dial(context.Background(), eps[0], nil)
	if err == nil {
		defer c.CloseNow()
	}
	if code := exitCode(t, cmd); code != 3 {
		t.Fatalf("exit code %d, want 3", code)
	}
}

func TestBadFlagsExit2(t *testing.T) {
	cases := map[string][]string{
		"unknown flag":          {"-nope"},
		"negative delay":        {"-accept-delay", "-1s"},
		"refuse 101":            {"-refuse", "101"},
		"count without port 0":  {"-count", "2", "-addr", "127.0.0.1:9"},
		"zero count":            {"-count", "0"},
		"bad addr":              {"-addr", "nohostport"},
		"stray argument":        {"extra"},
		"negative message cap":  {"-close-after-messages", "-1"},
		"status out of range":   {"-refuse", "700"},
		"duration not duration": {"-echo-delay", "fast"},
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			out, err := exec.Command(binPath, args...).CombinedOutput()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 2 {
				t.Fatalf("exit %v, want code 2; output %s", err, out)
			}
			if len(strings.TrimSpace(string(out))) == 0 {
				t.Fatal("no message")
			}
		})
	}
}
