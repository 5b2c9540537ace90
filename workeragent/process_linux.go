//go:build linux

package workeragent

import "syscall"

// sysProcAttr puts a launched browser in its own process group (so the
// agent can kill it with everything it started) and has the kernel kill it
// if the agent dies first.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
