package chaos

import (
	"net"

	"golang.org/x/sys/unix"
)

// Linux's TCP states (include/net/tcp_states.h): a connection the peer
// reset goes to TCP_CLOSE; one the peer closed with a FIN waits in
// TCP_CLOSE_WAIT until this side closes it too.
const (
	tcpClose     = 7
	tcpCloseWait = 8
)

// endedBeforeAnyByte reports whether the peer ended c before sending it a
// byte, and whether it did so with a reset (else a FIN), as the kernel
// saw it. A reload cuts handshakes in both ways: Linux resets the
// connections still queued on a listener that closes, and net/http
// closes (FIN) a connection whose request it reads once its server's
// shutdown has begun. A byte is a segment with data (tcpi_data_segs_in):
// a FIN alone counts in tcpi_bytes_received.
func endedBeforeAnyByte(c *net.TCPConn) (ended, reset bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return false, false
	}
	var info *unix.TCPInfo
	if err := raw.Control(func(fd uintptr) {
		info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || info == nil || info.Data_segs_in > 0 {
		return false, false
	}
	return info.State == tcpClose || info.State == tcpCloseWait, info.State == tcpClose
}
