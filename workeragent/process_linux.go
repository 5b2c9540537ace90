//go:build linux

package workeragent

import (
	"net"
	"syscall"
	"time"
)

// sysProcAttr puts a launched browser in its own process group (so the
// agent can kill it with everything it started) and has the kernel kill it
// if the agent dies first.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// setUserTimeout sets TCP_USER_TIMEOUT: data the peer does not acknowledge
// within d fails the connection.
func setUserTimeout(c *net.TCPConn, d time.Duration) {
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, 0x12 /* TCP_USER_TIMEOUT */, int(d.Milliseconds()))
	})
}
