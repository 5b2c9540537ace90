package chaos

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// listeners counts the sockets listening on TCP port (any address, IPv4
// and IPv6) in this process's network namespace, from /proc: Caddy binds
// each config's listeners with SO_REUSEPORT, so while a reload runs a
// port has two.
func listeners(port int) (int, error) {
	n := 0
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		raw, err := os.ReadFile(table)
		if errors.Is(err, os.ErrNotExist) && strings.HasSuffix(table, "6") {
			continue // no IPv6
		}
		if err != nil {
			return 0, fmt.Errorf("reading the sockets of port %d: %w", port, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(raw))
		sc.Buffer(make([]byte, 0, 4096), 1<<20)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local_address rem_address st ...
			f := bytes.Fields(sc.Bytes())
			if len(f) < 4 || string(f[3]) != "0A" { // TCP_LISTEN
				continue
			}
			if i := bytes.LastIndexByte(f[1], ':'); i >= 0 {
				if p, err := strconv.ParseUint(string(f[1][i+1:]), 16, 16); err == nil && int(p) == port {
					n++
				}
			}
		}
	}
	return n, nil
}

// oneListener waits until port has at most one listener, the running
// config's, and returns when it saw that: a reload's replaced listener
// is then closed. An error if it has not within timeout (a reload that
// leaves its predecessor's listener open is a leak).
func oneListener(port int, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		n, err := listeners(port)
		if err != nil {
			return time.Now(), err
		}
		if n <= 1 {
			return time.Now(), nil
		}
		if time.Now().After(deadline) {
			return time.Now(), fmt.Errorf("port %d still has %d listeners %s after the reload: the replaced config's did not close", port, n, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// panicsIn counts the handler panics net/http recovered and logged in
// the given log files (Caddy routes its "http: panic serving" lines to
// its log at ERROR), and returns the first such line.
func panicsIn(logs []string) (int, string, error) {
	n, first := 0, ""
	for _, path := range logs {
		f, err := os.Open(path)
		if err != nil {
			return 0, "", fmt.Errorf("reading %s for panics: %w", path, err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "http: panic serving") {
				if n++; first == "" {
					first = sc.Text()
				}
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return 0, "", fmt.Errorf("reading %s for panics: %w", path, err)
		}
	}
	return n, first, nil
}
