package workeragent

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// The relay joins a session's two connections: the proxy's (Caddy's,
// carrying the client's frames) and the browser's. It copies bytes, but
// it reads the WebSocket frame headers as they pass (RFC 6455 5.2), for
// two reasons: idle time is measured on data frames only, so keep-alive
// pings do not keep an idle session; and the agent can end a session with
// a close frame of its own, written between two of the browser's frames,
// with a code and a reason the client shows.

// relayBuffer is each direction's read buffer: a frame no larger is
// written in one piece, together with the complete frames buffered after
// it.
const relayBuffer = 64 << 10

// closeGrace is how long the client has to answer the agent's close frame
// before its connection is closed.
const closeGrace = time.Second

// WebSocket close codes the agent sends.
const (
	// CloseNormal: an operator ended the session.
	CloseNormal = 1000
	// CloseGoingAway: the browser or the grid goes away (a drain past
	// its timeout, Caddy stopping or reloaded).
	CloseGoingAway = 1001
	// ClosePolicy: a limit of the grid ended it (max_session,
	// idle_timeout).
	ClosePolicy = 1008
)

// relay is one session's two connections.
type relay struct {
	proxy   net.Conn
	proxyR  *bufio.Reader
	browser net.Conn
	browR   *bufio.Reader
	// released: the browser was told the session is over (release).
	released sync.Once

	// lastData is when a data frame last passed either way (UnixNano).
	lastData atomic.Int64
	// toProxy and toBrowser count the bytes relayed each way.
	toProxy, toBrowser atomic.Int64

	// wmu orders what is written to the proxy: the browser's frames, and
	// the agent's close frame, which goes only between two of them. It is
	// held across a write; mu, never held across I/O, guards the rest.
	wmu       sync.Mutex
	mu        sync.Mutex
	mid       bool   // the browser→proxy copy is inside a frame
	closeWith []byte // the agent's close frame, until it is written
	ending    bool   // the agent ends the session

	// why names what ended the session, once the agent did (a metric's
	// label).
	why atomic.Pointer[string]
}

func newRelay(proxy net.Conn, proxyR *bufio.Reader, browser net.Conn, browR *bufio.Reader) *relay {
	r := &relay{proxy: proxy, proxyR: proxyR, browser: browser, browR: browR}
	r.lastData.Store(time.Now().UnixNano())
	return r
}

// run copies both ways until the session ends, and returns with both
// connections closed. It returns only once the browser has closed its
// side too (or closeGrace passed): until then the browser still holds
// the session, which counts against the worker's limits.
func (r *relay) run() {
	done := make(chan struct{})
	go func() {
		r.copyFrames(r.proxy, r.browR, &r.toProxy, true)
		// The browser closed, the agent's close frame is written, or the
		// client is gone: wait for the browser's end.
		r.release()
		_, _ = io.Copy(io.Discard, r.browR)
		r.browser.Close()
		r.mu.Lock()
		ending := r.ending
		r.mu.Unlock()
		if ending {
			// let the client answer, so that the frame is not lost to a reset
			_ = r.proxy.SetReadDeadline(time.Now().Add(closeGrace))
		} else {
			r.proxy.Close()
		}
		close(done)
	}()
	r.copyFrames(r.browser, r.proxyR, &r.toBrowser, false)
	r.release()
	r.proxy.Close()
	<-done
}

// release tells the browser the session is over by closing the agent's
// side of its connection for writing; the browser closes its own, which
// the browser→proxy copy reads, within closeGrace or the read is cut.
func (r *relay) release() {
	r.released.Do(func() {
		_ = r.browser.SetReadDeadline(time.Now().Add(closeGrace))
		if cw, ok := r.browser.(interface{ CloseWrite() error }); !ok || cw.CloseWrite() != nil {
			r.browser.Close()
		}
	})
}

// end ends the session: a close frame of code and reason to the client
// (at once, or when the browser's frame being copied is done), then both
// connections close. why names the cause for metrics. It never waits on a
// client that stopped reading for longer than closeGrace: a write stuck
// on one fails by then.
func (r *relay) end(code int, why, reason string) {
	r.mu.Lock()
	if r.ending {
		r.mu.Unlock()
		return
	}
	r.ending = true
	r.why.Store(&why)
	frame := closeFrame(code, reason)
	_ = r.proxy.SetWriteDeadline(time.Now().Add(closeGrace))
	if r.mid {
		r.closeAfterFrame(frame)
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	// A frame being written ends first (or by the deadline); no other
	// begins, the session ending.
	r.wmu.Lock()
	r.mu.Lock()
	mid := r.mid // a frame begun as the session was told to end
	if mid {
		r.closeAfterFrame(frame)
	}
	r.mu.Unlock()
	if !mid {
		_, _ = r.proxy.Write(frame)
	}
	r.wmu.Unlock()
	if !mid {
		// The browser→proxy copy stops at its next write; the browser,
		// told, ends its read.
		r.release()
	}
}

// closeAfterFrame leaves the close frame to the browser→proxy copy, which
// writes it when its frame is done (r.mu held); a browser that never
// finishes its frame does not hold the end.
func (r *relay) closeAfterFrame(frame []byte) {
	r.closeWith = frame
	time.AfterFunc(5*closeGrace, func() { r.browser.Close() })
}

// idle is how long no data frame passed.
func (r *relay) idle() time.Duration {
	return time.Since(time.Unix(0, r.lastData.Load()))
}

// errFrame is a frame header the relay cannot follow (a 64-bit length
// with its top bit set). It ends the session.
var errFrame = errors.New("malformed WebSocket frame")

// headerLen is the length of the frame header that starts with b0 b1.
func headerLen(b1 byte) int {
	n := 2
	switch b1 & 0x7f {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if b1&0x80 != 0 {
		n += 4 // mask key
	}
	return n
}

// parseHeader reads a whole frame header: the payload's length and the
// opcode.
func parseHeader(b []byte) (plen uint64, op byte, err error) {
	op = b[0] & 0x0f
	switch plen = uint64(b[1] & 0x7f); plen {
	case 126:
		plen = uint64(binary.BigEndian.Uint16(b[2:4]))
	case 127:
		plen = binary.BigEndian.Uint64(b[2:10])
		if plen>>63 != 0 {
			return 0, op, errFrame
		}
	}
	return plen, op, nil
}

// nextFrame peeks at the next frame header of src.
func nextFrame(src *bufio.Reader) (hlen int, plen uint64, op byte, err error) {
	b, err := src.Peek(2)
	if err != nil {
		return 0, 0, 0, err
	}
	hlen = headerLen(b[1])
	if b, err = src.Peek(hlen); err != nil {
		return 0, 0, 0, err
	}
	plen, op, err = parseHeader(b)
	return hlen, plen, op, err
}

// buffered is how many bytes of src, from off, hold complete frames that
// fit the buffer, and whether any of them is a data frame.
func buffered(src *bufio.Reader, off int) (span int, data bool) {
	b, _ := src.Peek(src.Buffered())
	span = off
	for len(b)-span >= 2 {
		h := headerLen(b[span+1])
		if len(b)-span < h {
			break
		}
		plen, op, err := parseHeader(b[span:])
		if err != nil || uint64(h)+plen > uint64(len(b)-span) {
			break
		}
		data = data || op < 8
		span += h + int(plen)
	}
	return span, data
}

// copyFrames copies frames from src to dst until either fails. A frame
// that fits the buffer goes in one write with the complete frames buffered
// after it; a larger one streams, its header first. toProxy: dst is the
// proxy, whose writes r.mu orders. Toward the browser, once the agent ends
// the session, the client's frames are read and dropped until its close
// frame.
func (r *relay) copyFrames(dst net.Conn, src *bufio.Reader, count *atomic.Int64, toProxy bool) {
	for {
		hlen, plen, op, err := nextFrame(src)
		if err != nil {
			return
		}
		if op < 8 {
			r.lastData.Store(time.Now().UnixNano())
		}
		if !toProxy && op == 8 && r.isEnding() {
			return // the client answered the agent's close frame
		}
		total := uint64(hlen) + plen
		if total <= relayBuffer {
			if _, err := src.Peek(int(total)); err != nil {
				return
			}
			span, data := buffered(src, int(total))
			if data {
				r.lastData.Store(time.Now().UnixNano())
			}
			b, _ := src.Peek(span)
			if !r.write(dst, b, toProxy, false) {
				return
			}
			_, _ = src.Discard(span)
			count.Add(int64(span))
			continue
		}
		b, _ := src.Peek(hlen)
		if !r.write(dst, b, toProxy, true) {
			return
		}
		_, _ = src.Discard(hlen)
		var w io.Writer = dst
		if !toProxy && r.isEnding() {
			w = io.Discard
		}
		if _, err := io.CopyN(w, src, int64(plen)); err != nil {
			return
		}
		count.Add(int64(total))
		if !r.write(dst, nil, toProxy, false) {
			return
		}
	}
}

func (r *relay) isEnding() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ending
}

// write writes b to dst and reports whether copying goes on. Toward the
// proxy it keeps r.mid (the copy is inside a frame after this write) and
// writes a pending close frame once the frame is done; toward the browser,
// once the session is ending, it drops what it is given.
func (r *relay) write(dst net.Conn, b []byte, toProxy, mid bool) bool {
	if !toProxy {
		if r.isEnding() {
			return true
		}
		_, err := dst.Write(b)
		return err == nil || r.isEnding()
	}
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.mu.Lock()
	stop := r.ending && !r.mid
	r.mu.Unlock()
	if stop {
		return false // ended between two frames: its close frame is written
	}
	if len(b) > 0 {
		if _, err := dst.Write(b); err != nil {
			return false
		}
	}
	r.mu.Lock()
	r.mid = mid
	closeWith := r.closeWith
	if !mid {
		r.closeWith = nil
	}
	r.mu.Unlock()
	if !mid && closeWith != nil {
		_ = dst.SetWriteDeadline(time.Now().Add(closeGrace))
		_, _ = dst.Write(closeWith)
		return false
	}
	return true
}

// closeFrame is an unmasked close frame (server to client) with code and
// reason, the reason cut to the 123 bytes a control frame allows.
func closeFrame(code int, reason string) []byte {
	if len(reason) > 123 {
		// whole characters only: a close reason is UTF-8
		reason = strings.ToValidUTF8(reason[:123], "")
		for !utf8.ValidString(reason) {
			reason = reason[:len(reason)-1]
		}
	}
	b := make([]byte, 0, 4+len(reason))
	b = append(b, 0x88, byte(2+len(reason)))
	b = binary.BigEndian.AppendUint16(b, uint16(code))
	return append(b, reason...)
}
