//go:build unix && !linux

package workeragent

import "syscall"

// sysProcAttr puts a launched browser in its own process group so the
// agent can kill it with everything it started.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
