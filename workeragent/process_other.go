//go:build unix && !linux

package workeragent

import (
	"net"
	"syscall"
	"time"
)

// sysProcAttr puts a launched browser in its own process group so the
// agent can kill it with everything it started.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// setUserTimeout: TCP keepalive alone finds a vanished proxy here.
func setUserTimeout(*net.TCPConn, time.Duration) {}
