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
func ReadPort(pid, port int) (Port, error) {
	var out Port
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
			i := bytes.LastIndexByte(f[1], ':')
			if i < 0 {
				continue
			}
			if p, err := strconv.ParseUint(string(f[1][i+1:]), 16, 16); err != nil || int(p) != port {
				continue
			}
			switch string(f[3]) {
			case "0A": // TCP_LISTEN
				if ino, err := strconv.ParseUint(string(f[9]), 10, 64); err == nil {
					out.Listening = append(out.Listening, ino)
				}
			case "01": // TCP_ESTABLISHED
				out.Established++
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return Port{}, fmt.Errorf("reading the sockets of port %d: %w", port, err)
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
