package wsock

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"
	"unicode/utf8"
)

// writeChunk bounds the scratch buffer a client uses to mask a payload, so
// writing a large message does not copy it whole.
const writeChunk = 32 << 10

// DefaultCloseTimeout is how long Close waits for the peer's close frame
// before it drops the connection.
const DefaultCloseTimeout = 5 * time.Second

// Conn is one WebSocket connection, client or server side.
type Conn struct {
	nc     net.Conn
	br     *bufio.Reader
	client bool // a client masks what it writes and expects unmasked frames

	// Reading: one goroutine at a time (rmu); Close takes rmu only when no
	// reader holds it.
	rmu        sync.Mutex
	readLimit  int64
	hdr        [maxFrameHeader]byte
	readErr    error
	peerClosed chan struct{} // closed once the peer's close frame (or a read error) arrived
	peerOnce   sync.Once
	onPing     func([]byte)
	onPong     func([]byte)

	// Writing: any number of goroutines, serialised by wmu.
	wmu       sync.Mutex
	wbuf      []byte
	closeSent bool

	closeOnce sync.Once
	closeErr  error
}

func newConn(nc net.Conn, br *bufio.Reader, client bool, limit int64) *Conn {
	if br == nil {
		br = bufio.NewReaderSize(nc, 4096)
	}
	if limit <= 0 {
		limit = defaultMaxMessageSize
	}
	return &Conn{nc: nc, br: br, client: client, readLimit: limit, peerClosed: make(chan struct{})}
}

// NetConn is the underlying connection (for deadlines, addresses).
func (c *Conn) NetConn() net.Conn { return c.nc }

// LocalAddr is the local network address.
func (c *Conn) LocalAddr() net.Addr { return c.nc.LocalAddr() }

// RemoteAddr is the peer's network address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// SetReadLimit sets the largest message ReadMessage accepts, in bytes; a
// bigger one closes the connection with CloseMessageTooBig.
// Default: 32 MiB. Call it before reading.
func (c *Conn) SetReadLimit(n int64) {
	if n <= 0 {
		n = defaultMaxMessageSize
	}
	c.readLimit = n
}

// SetReadDeadline sets the deadline of reads on the underlying connection.
// A read that times out leaves the connection unusable.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.nc.SetReadDeadline(t) }

// SetWriteDeadline sets the deadline of writes on the underlying connection.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.nc.SetWriteDeadline(t) }

// OnPing sets a function called (in the reading goroutine) with the payload
// of every ping, after its pong was sent. Call it before reading.
func (c *Conn) OnPing(f func(payload []byte)) { c.onPing = f }

// OnPong sets a function called (in the reading goroutine) with the payload
// of every pong. Call it before reading.
func (c *Conn) OnPong(f func(payload []byte)) { c.onPong = f }

// ReadMessage returns the next text or binary message, reassembled from its
// fragments. Pings are answered and pongs reported on the way. Once the
// peer sends a close frame, the close is echoed and a *CloseError is
// returned; so it is when the connection drops (Code CloseAbnormal). A
// protocol violation closes the connection and returns a *ProtocolError.
func (c *Conn) ReadMessage() (Opcode, []byte, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.readErr != nil {
		return 0, nil, c.readErr
	}
	op, msg, err := c.readMessage()
	if err != nil {
		c.readErr = err
		c.peerOnce.Do(func() { close(c.peerClosed) })
	}
	return op, msg, err
}

func (c *Conn) readMessage() (Opcode, []byte, error) {
	var (
		msgOp   Opcode
		msg     []byte
		started bool
	)
	for {
		h, err := readHeader(c.br, c.hdr[:])
		if err != nil {
			return 0, nil, c.fail(err)
		}
		if err := c.check(h, started); err != nil {
			return 0, nil, c.fail(err)
		}
		if h.op.control() {
			payload := make([]byte, h.length)
			if _, err := io.ReadFull(c.br, payload); err != nil {
				return 0, nil, c.fail(err)
			}
			if h.masked {
				mask(h.key, 0, payload)
			}
			if err := c.control(h.op, payload); err != nil {
				return 0, nil, err
			}
			continue
		}
		if !started {
			msgOp, started = h.op, true
		}
		if int64(len(msg))+h.length > c.readLimit {
			return 0, nil, c.fail(&ProtocolError{CloseMessageTooBig, "message larger than the read limit"})
		}
		n := len(msg)
		if msg, err = readAppend(c.br, msg, h.length); err != nil {
			return 0, nil, c.fail(err)
		}
		if h.masked {
			mask(h.key, 0, msg[n:])
		}
		if h.fin {
			if msgOp == OpText && !utf8.Valid(msg) {
				return 0, nil, c.fail(&ProtocolError{CloseInvalidPayload, "text message is not valid UTF-8"})
			}
			return msgOp, msg, nil
		}
	}
}

// check validates a frame header against RFC 6455 §5.
func (c *Conn) check(h frameHeader, started bool) error {
	if h.rsv != 0 {
		return &ProtocolError{CloseProtocolError, "reserved bits set without a negotiated extension"}
	}
	if h.masked == c.client {
		if c.client {
			return &ProtocolError{CloseProtocolError, "server sent a masked frame"}
		}
		return &ProtocolError{CloseProtocolError, "client sent an unmasked frame"}
	}
	switch h.op {
	case OpPing, OpPong, OpClose:
		if !h.fin {
			return &ProtocolError{CloseProtocolError, "fragmented control frame"}
		}
		if h.length > maxControlPayload {
			return &ProtocolError{CloseProtocolError, "control frame payload over 125 bytes"}
		}
	case OpText, OpBinary:
		if started {
			return &ProtocolError{CloseProtocolError, "new message before the previous one finished"}
		}
	case OpContinuation:
		if !started {
			return &ProtocolError{CloseProtocolError, "continuation frame without a message"}
		}
	default:
		return &ProtocolError{CloseProtocolError, "unknown opcode " + h.op.String()}
	}
	return nil
}

// control handles a ping, pong or close frame read in the middle of the
// message stream.
func (c *Conn) control(op Opcode, payload []byte) error {
	switch op {
	case OpPing:
		if err := c.writeFrame(OpPong, payload); err != nil && !errors.Is(err, ErrClosed) {
			return c.fail(err)
		}
		if c.onPing != nil {
			c.onPing(payload)
		}
	case OpPong:
		if c.onPong != nil {
			c.onPong(payload)
		}
	case OpClose:
		ce := &CloseError{Code: CloseNoStatus}
		switch {
		case len(payload) == 1:
			return c.fail(&ProtocolError{CloseProtocolError, "close frame with a one-byte payload"})
		case len(payload) >= 2:
			ce.Code = int(binary.BigEndian.Uint16(payload))
			ce.Reason = string(payload[2:])
			if !validCloseCode(ce.Code) {
				return c.fail(&ProtocolError{CloseProtocolError, "close frame with an invalid status code"})
			}
			if !utf8.ValidString(ce.Reason) {
				return c.fail(&ProtocolError{CloseInvalidPayload, "close reason is not valid UTF-8"})
			}
		}
		// Echo the close (RFC 6455 §5.5.1) unless we started the handshake.
		echo := CloseNormal
		if ce.Code != CloseNoStatus {
			echo = ce.Code
		}
		_ = c.writeClose(echo, "")
		return ce
	}
	return nil
}

// fail turns a read failure into the error ReadMessage reports. A protocol
// error is told to the peer and ends the connection.
func (c *Conn) fail(err error) error {
	var pe *ProtocolError
	if errors.As(err, &pe) {
		_ = c.writeClose(pe.Code, pe.Msg)
		_ = c.nc.Close()
		return pe
	}
	return &CloseError{Code: CloseAbnormal, Err: err}
}

// WriteMessage sends one text or binary message in a single frame.
func (c *Conn) WriteMessage(op Opcode, data []byte) error {
	if op != OpText && op != OpBinary {
		return errors.New("wsock: WriteMessage takes OpText or OpBinary, got " + op.String())
	}
	return c.writeFrame(op, data)
}

// WriteText sends a text message.
func (c *Conn) WriteText(s string) error { return c.writeFrame(OpText, []byte(s)) }

// Ping sends a ping; the peer's pong is reported to the OnPong function by
// the reading goroutine.
func (c *Conn) Ping(payload []byte) error {
	if len(payload) > maxControlPayload {
		return errors.New("wsock: ping payload over 125 bytes")
	}
	return c.writeFrame(OpPing, payload)
}

func (c *Conn) writeFrame(op Opcode, data []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closeSent {
		return ErrClosed
	}
	return c.writeFrameLocked(true, op, data)
}

// writeFrameLocked writes one frame; wmu is held.
func (c *Conn) writeFrameLocked(fin bool, op Opcode, data []byte) error {
	if !c.client {
		hdr := appendHeader(c.wbuf[:0], fin, op, len(data), nil)
		c.wbuf = hdr
		bufs := net.Buffers{hdr, data}
		_, err := bufs.WriteTo(c.nc)
		return err
	}
	var key [4]byte
	if _, err := rand.Read(key[:]); err != nil {
		return err
	}
	buf := appendHeader(c.wbuf[:0], fin, op, len(data), &key)
	pos := 0
	for {
		n := min(len(data), writeChunk)
		start := len(buf)
		buf = append(buf, data[:n]...)
		pos = mask(key, pos, buf[start:])
		if _, err := c.nc.Write(buf); err != nil {
			c.wbuf = buf[:0]
			return err
		}
		data = data[n:]
		buf = buf[:0]
		if len(data) == 0 {
			break
		}
	}
	c.wbuf = buf
	return nil
}

// writeClose sends a close frame once.
func (c *Conn) writeClose(code int, reason string) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closeSent {
		return ErrClosed
	}
	c.closeSent = true
	var p []byte
	if code != CloseNoStatus {
		if len(reason) > maxControlPayload-2 {
			reason = truncateUTF8(reason, maxControlPayload-2)
		}
		p = binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(reason)), uint16(code))
		p = append(p, reason...)
	}
	_ = c.nc.SetWriteDeadline(time.Now().Add(DefaultCloseTimeout))
	return c.writeFrameLocked(true, OpClose, p)
}

// Close runs the close handshake with CloseNormal and closes the
// connection. See CloseWith.
func (c *Conn) Close() error { return c.CloseWith(CloseNormal, "", DefaultCloseTimeout) }

// CloseWith sends a close frame with code and reason (truncated to fit),
// waits up to timeout for the peer's close frame, and closes the
// connection. When another goroutine is blocked in ReadMessage, that reader
// receives the peer's close; otherwise CloseWith reads (and discards) what
// is left itself. Safe to call more than once and concurrently with reads
// and writes.
func (c *Conn) CloseWith(code int, reason string, timeout time.Duration) error {
	c.closeOnce.Do(func() {
		_ = c.writeClose(code, reason)
		deadline := time.Now().Add(timeout)
		if c.rmu.TryLock() {
			if c.readErr == nil {
				_ = c.nc.SetReadDeadline(deadline)
				for {
					if _, _, err := c.readMessage(); err != nil {
						c.readErr = err
						break
					}
				}
			}
			c.peerOnce.Do(func() { close(c.peerClosed) })
			c.rmu.Unlock()
		} else {
			t := time.NewTimer(timeout)
			select {
			case <-c.peerClosed:
			case <-t.C:
			}
			t.Stop()
		}
		c.closeErr = c.nc.Close()
		if errors.Is(c.closeErr, net.ErrClosed) {
			c.closeErr = nil
		}
	})
	return c.closeErr
}

// Abort drops the connection without a close handshake.
func (c *Conn) Abort() error { return c.nc.Close() }

func truncateUTF8(s string, n int) string {
	for n > 0 && n < len(s) && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// readAppend appends exactly n bytes from r to b. It grows b as the bytes
// arrive, so a header that announces a large frame costs no memory before
// the data actually comes.
func readAppend(r io.Reader, b []byte, n int64) ([]byte, error) {
	for n > 0 {
		step := int(min(n, 64<<10))
		start := len(b)
		b = append(b, make([]byte, step)...)
		if _, err := io.ReadFull(r, b[start:]); err != nil {
			return b, err
		}
		n -= int64(step)
	}
	return b, nil
}
