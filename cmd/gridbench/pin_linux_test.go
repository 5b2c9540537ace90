package main

import (
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPinApart checks what the pinned measurements rely on: Redis alone on
// the last CPU this process may use, the others and gridbench itself on the
// rest, and everything back afterwards. Two sleeping processes stand in for
// Redis and Caddy.
func TestPinApart(t *testing.T) {
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		t.Fatal(err)
	}
	start := func() int {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd.Process.Pid
	}
	redis, other := start(), start()
	p, err := pinApart(redis, other)
	if mine.Count() < 2 {
		if err == nil {
			t.Fatalf("pinApart with %d CPU: no error", mine.Count())
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if !mine.IsSet(p.redisCPU) {
		t.Fatalf("Redis put on CPU %d, outside this process' set", p.redisCPU)
	}
	set := func(pid int) unix.CPUSet {
		var s unix.CPUSet
		if err := unix.SchedGetaffinity(pid, &s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := set(redis); s.Count() != 1 || !s.IsSet(p.redisCPU) {
		t.Errorf("Redis may run on %d CPUs (CPU %d set: %v), want CPU %d alone", s.Count(), p.redisCPU, s.IsSet(p.redisCPU), p.redisCPU)
	}
	for name, pid := range map[string]int{"the other process": other, "gridbench": os.Getpid()} {
		s := set(pid)
		if s.IsSet(p.redisCPU) || s.Count() != mine.Count()-1 {
			t.Errorf("%s may run on %d CPUs, Redis' among them: %v; want the %d others", name, s.Count(), s.IsSet(p.redisCPU), mine.Count()-1)
		}
	}
	if err := p.restore(); err != nil {
		t.Fatal(err)
	}
	for name, pid := range map[string]int{"Redis": redis, "gridbench": os.Getpid()} {
		if s := set(pid); s != mine {
			t.Errorf("after restore %s may run on %d CPUs, want this process' %d", name, s.Count(), mine.Count())
		}
	}
}

// TestPinApartFailsClean: when a process cannot be pinned (here one that
// has exited), pinApart returns no cpuPin to restore, so it must put back
// what it had moved already: Redis stays on one CPU otherwise.
func TestPinApartFailsClean(t *testing.T) {
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		t.Fatal(err)
	}
	// (on one CPU pinApart refuses before moving anything: the checks
	// below hold as well)
	redis := exec.Command("sleep", "60")
	if err := redis.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = redis.Process.Kill(); _ = redis.Wait() })
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if _, err := pinApart(redis.Process.Pid, gone.Process.Pid); err == nil {
		t.Fatal("pinApart with an exited process: no error")
	}
	for name, pid := range map[string]int{"Redis": redis.Process.Pid, "gridbench": os.Getpid()} {
		var s unix.CPUSet
		if err := unix.SchedGetaffinity(pid, &s); err != nil {
			t.Fatal(err)
		}
		if s != mine {
			t.Errorf("after a failed pinApart %s may run on %d CPUs, want this process' %d", name, s.Count(), mine.Count())
		}
	}
}
