// Package sockets reads the machine's sockets from /proc: for the test
// harnesses that watch Caddy's listeners through a reload, and for the
// worker agent, which counts its browser's live connections.
package sockets

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Listening counts the sockets listening on TCP port (any address, IPv4
// and IPv6), from /proc/net/tcp and tcp6 of the caller's network
// namespace. Caddy binds each config's listeners with SO_REUSEPORT, so
// while a reload runs, a port has two.
func Listening(port int) (int, error) {
	n := 0
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(table)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("reading the listening sockets: %w", err)
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 4 || f[3] != "0A" { // 0A: TCP_LISTEN
				continue
			}
			_, hexPort, ok := strings.Cut(f[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); ok && err == nil && int(p) == port {
				n++
			}
		}
	}
	return n, nil
}

// Established counts the TCP connections accepted on local port (any
// address, IPv4 and IPv6) that are still established, from /proc/net/tcp
// and tcp6 of the caller's network namespace: the live clients of a
// server listening there. An error means it cannot tell (no /proc).
func Established(port int) (int, error) {
	n, read := 0, false
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(table)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("reading the established sockets: %w", err)
		}
		read = true
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 4 || f[3] != "01" { // 01: TCP_ESTABLISHED
				continue
			}
			_, hexPort, ok := strings.Cut(f[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); ok && err == nil && int(p) == port {
				n++
			}
		}
	}
	if !read {
		return 0, fmt.Errorf("reading the established sockets: no /proc/net/tcp")
	}
	return n, nil
}
