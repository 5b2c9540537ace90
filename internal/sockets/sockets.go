// Package sockets reads the machine's sockets from /proc: for the test
// harnesses that watch Caddy's listeners through a reload, and for the
// worker agent, which counts its browser's live connections.
package sockets

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Listening counts the sockets listening on TCP port (any address, IPv4
// and IPv6) in the caller's network namespace. Caddy binds each config's
// listeners with SO_REUSEPORT, so while a reload runs, a port has two.
func Listening(port int) (int, error) {
	p, err := ReadPort(os.Getpid(), port)
	return len(p.Listening), err
}

// Port is what a network namespace's TCP tables hold for one local port.
type Port struct {
	// Listening are the inodes of the sockets listening on it.
	Listening []uint64
	// Established counts the connections accepted on it still
	// established: the live clients of the server listening there.
	Established int
}

// ReadPort reads the TCP sockets (IPv4 and IPv6) of local port in the
// network namespace of process pid, from /proc/<pid>/net/tcp and tcp6. An
// error means it cannot tell (no /proc, or the process is gone).
func ReadPort(pid, port int) (Port, error) { return ReadPortExcept(pid, port, nil) }

// conn is an established connection as /proc writes its ends.
type conn struct{ local, remote string }

// ReadPortExcept is ReadPort, leaving out of Established the connections
// whose other end is one of the caller's sockets: a server's clients but
// the caller itself, when it is one of them (an agent probing the browser
// it counts). mine (nil: none) gives the caller's socket inodes, as
// SelfSockets does; it is called once the tables are read, so a socket the
// caller opened meanwhile is known. An end is matched by both its
// addresses: two sockets may share a local address when their peers
// differ.
func ReadPortExcept(pid, port int, mine func() map[uint64]bool) (Port, error) {
	var out Port
	var accepted []conn
	// the established sockets connected to the port, by inode: the only
	// ones of the caller's that can be a client of it
	toPort := map[uint64]conn{}
	suffix := []byte(fmt.Sprintf(":%04X", port)) // how /proc writes the port
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if errors.Is(err, os.ErrNotExist) && table == "tcp6" {
			continue // no IPv6
		}
		if err != nil {
			return Port{}, fmt.Errorf("reading the sockets of port %d: %w", port, err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 4096), 1<<20)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			f := bytes.Fields(sc.Bytes())
			if len(f) < 10 {
				continue
			}
			established := string(f[3]) == "01"
			if established && mine != nil && bytes.HasSuffix(f[2], suffix) {
				if ino, err := strconv.ParseUint(string(f[9]), 10, 64); err == nil {
					toPort[ino] = conn{procAddr(f[1]), procAddr(f[2])}
				}
			}
			if !bytes.HasSuffix(f[1], suffix) {
				continue
			}
			switch {
			case string(f[3]) == "0A": // TCP_LISTEN
				if ino, err := strconv.ParseUint(string(f[9]), 10, 64); err == nil {
					out.Listening = append(out.Listening, ino)
				}
			case established:
				accepted = append(accepted, conn{procAddr(f[1]), procAddr(f[2])})
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return Port{}, fmt.Errorf("reading the sockets of port %d: %w", port, err)
		}
	}
	own := map[conn]bool{}
	if mine != nil {
		for ino := range mine() {
			if c, ok := toPort[ino]; ok {
				// the server's end of it has the two ends the other way round
				own[conn{c.remote, c.local}] = true
			}
		}
	}
	for _, c := range accepted {
		if !own[c] {
			out.Established++
		}
	}
	return out, nil
}

// v4mapped starts a tcp6 address that is an IPv4 one (::ffff:a.b.c.d):
// /proc writes it as four host-order words, the last the IPv4 address as
// tcp writes it.
const v4mapped = "0000000000000000FFFF0000"

// procAddr is an address of /proc's tables in one form for both tables:
// an IPv4-mapped tcp6 address as tcp writes the IPv4 one (a dual-stack
// listener's end of an IPv4 connection is in tcp6, its client's in tcp).
func procAddr(a []byte) string {
	s := string(a)
	if len(s) > len(v4mapped)+8 && s[:len(v4mapped)] == v4mapped && s[len(v4mapped)+8] == ':' {
		return s[len(v4mapped):]
	}
	return s
}

// SelfSockets returns the inodes of the calling process's sockets (from
// /proc/self/fd), for ReadPortExcept: an empty map, never nil, when it
// cannot list them.
func SelfSockets() (map[uint64]bool, error) {
	out := map[uint64]bool{}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return out, fmt.Errorf("listing this process's sockets: %w", err)
	}
	for _, fd := range fds {
		l, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if err != nil || !strings.HasPrefix(l, "socket:[") || !strings.HasSuffix(l, "]") {
			continue
		}
		if ino, err := strconv.ParseUint(l[len("socket:["):len(l)-1], 10, 64); err == nil {
			out[ino] = true
		}
	}
	return out, nil
}

// Owned reports whether a process in one of the process groups pgids
// holds one of the sockets inodes (its /proc/<pid>/fd), so a listener on
// a port is the browser's own and not another program's on the same port
// (a container runtime's port proxy, a sidecar).
func Owned(inodes []uint64, pgids []int) (bool, error) {
	want := map[string]bool{}
	for _, ino := range inodes {
		want["socket:["+strconv.FormatUint(ino, 10)+"]"] = true
	}
	groups := map[int]bool{}
	for _, g := range pgids {
		groups[g] = true
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return false, fmt.Errorf("listing processes: %w", err)
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces and ')'
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(stat[i+1:])
		if len(f) < 3 {
			continue
		}
		if g, err := strconv.Atoi(string(f[2])); err != nil || !groups[g] {
			continue
		}
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && want[l] {
				return true, nil
			}
		}
	}
	return false, nil
}
