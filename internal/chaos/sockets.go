package chaos

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/sockets"
)

// oneListener waits until port has at most one listener, the running
// config's, and returns when it saw that: a reload's replaced listener
// is then closed. An error if it has not within timeout (a reload that
// leaves its predecessor's listener open is a leak).
func oneListener(port int, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		n, err := sockets.Listening(port)
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
