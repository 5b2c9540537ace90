package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// A pinned measurement (redis-targets' caddy-pinned part) gives Redis a
// core of its own, as a deployment does, and puts everything else on the
// other cores. Sharing a core with Caddy and the clients, Redis ran the
// same scripts about twice as slowly on the 2-core machine this was
// written on (docs/perf/registry-profile.md), so a shared figure says as
// much about the machine's cores as about the scripts.

// cpuPin is a CPU placement made by pinApart, undone by its restore.
type cpuPin struct {
	redisCPU int
	redis    int
	self     unix.CPUSet
}

// pinApart puts every thread of process redis on the last CPU this process
// may use and every thread of the others (and of this process) on the rest
// of them (a container's CPU set need not start at CPU 0). It needs two
// CPUs or more. On an error it has put Redis and this process back.
func pinApart(redis int, others ...int) (*cpuPin, error) {
	p := &cpuPin{redis: redis}
	if err := unix.SchedGetaffinity(0, &p.self); err != nil {
		return nil, fmt.Errorf("reading this process' CPU set: %w", err)
	}
	var cpus []int
	for i := range len(p.self) * 64 {
		if p.self.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	if len(cpus) < 2 {
		return nil, fmt.Errorf("pinning Redis apart needs 2 CPUs, this process may use %d", len(cpus))
	}
	p.redisCPU = cpus[len(cpus)-1]
	var alone, rest unix.CPUSet
	alone.Set(p.redisCPU)
	for _, c := range cpus[:len(cpus)-1] {
		rest.Set(c)
	}
	if err := pinThreads(redis, &alone); err != nil {
		return nil, errors.Join(err, p.restore())
	}
	for _, pid := range append(others, os.Getpid()) {
		if err := pinThreads(pid, &rest); err != nil {
			// the caller gets no cpuPin: put Redis and gridbench back here
			return nil, errors.Join(err, p.restore())
		}
	}
	return p, nil
}

// restore gives this process and Redis this process' CPU set back (the
// other pinned processes are stopped by their owners). A Redis that has
// exited meanwhile has nothing to restore.
func (p *cpuPin) restore() error {
	if err := pinThreads(p.redis, &p.self); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return pinThreads(os.Getpid(), &p.self)
}

// pinThreads sets the CPU set of every thread of pid (a new thread takes
// its creator's set, so the process stays there).
func pinThreads(pid int, set *unix.CPUSet) error {
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return fmt.Errorf("listing the threads of process %d: %w", pid, err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		// a thread may end meanwhile (ESRCH): nothing left to place
		if err := unix.SchedSetaffinity(tid, set); err != nil && err != unix.ESRCH {
			return fmt.Errorf("pinning thread %d of process %d: %w", tid, pid, err)
		}
	}
	return nil
}
