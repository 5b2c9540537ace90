package main

import "syscall"

// childAttr puts a child in its own process group (so that stopping it
// reaches what it started) and has the kernel kill it should gridbench
// die first, so that no part outlives a run.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
