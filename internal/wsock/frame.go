// Package wsock is a small WebSocket implementation (RFC 6455) on the
// standard library: the server side of the opening handshake over an
// http.Hijacker, a client dialer for ws:// and wss://, and message framing
// with masking, fragmentation, ping/pong, the close handshake and size
// limits.
//
// It exists so the project's tools and tests (fakebrowser, the worker
// agent's probes, the grid's end-to-end tests) speak WebSocket without a
// third-party dependency. It does not negotiate extensions (no
// permessage-deflate): a peer that sets a reserved bit is a protocol error.
//
// A Conn supports one reader goroutine and any number of writers at once.
// Control frames that arrive while reading are answered inside ReadMessage:
// a ping gets its pong, a close gets its echo.
package wsock

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Opcode is a frame's type (RFC 6455 §5.2).
type Opcode byte

// The opcodes of RFC 6455 §11.8.
const (
	OpContinuation Opcode = 0x0
	OpText         Opcode = 0x1
	OpBinary       Opcode = 0x2
	OpClose        Opcode = 0x8
	OpPing         Opcode = 0x9
	OpPong         Opcode = 0xA
)

func (o Opcode) String() string {
	switch o {
	case OpContinuation:
		return "continuation"
	case OpText:
		return "text"
	case OpBinary:
		return "binary"
	case OpClose:
		return "close"
	case OpPing:
		return "ping"
	case OpPong:
		return "pong"
	}
	return fmt.Sprintf("opcode(%#x)", byte(o))
}

func (o Opcode) control() bool { return o&0x8 != 0 }

// Close status codes (RFC 6455 §7.4.1).
const (
	CloseNormal           = 1000
	CloseGoingAway        = 1001
	CloseProtocolError    = 1002
	CloseUnsupportedData  = 1003
	CloseNoStatus         = 1005 // never sent; reported when a close frame has no code
	CloseAbnormal         = 1006 // never sent; reported when the connection dropped without a close frame
	CloseInvalidPayload   = 1007
	ClosePolicyViolation  = 1008
	CloseMessageTooBig    = 1009
	CloseInternalError    = 1011
	maxControlPayload     = 125
	maxFrameHeader        = 14
	defaultMaxMessageSize = 32 << 20
)

// CloseError is returned by ReadMessage once the peer has sent a close
// frame (Code is CloseNoStatus when the frame carried no code), and wraps
// the cause when the connection ended without one (Code CloseAbnormal).
type CloseError struct {
	Code   int
	Reason string
	// Err is what ended the connection when no close frame arrived.
	Err error
}

func (e *CloseError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("websocket closed abnormally (%d): %v", e.Code, e.Err)
	}
	if e.Reason == "" {
		return fmt.Sprintf("websocket closed by peer: %d", e.Code)
	}
	return fmt.Sprintf("websocket closed by peer: %d %s", e.Code, e.Reason)
}

func (e *CloseError) Unwrap() error { return e.Err }

// ErrClosed is returned by writes after the close handshake started.
var ErrClosed = errors.New("websocket connection closed")

// ProtocolError is a peer's violation of RFC 6455. The connection is closed
// with Code after it is reported.
type ProtocolError struct {
	Code int
	Msg  string
}

func (e *ProtocolError) Error() string { return "websocket protocol error: " + e.Msg }

// frameHeader is a decoded frame header.
type frameHeader struct {
	fin    bool
	rsv    byte
	op     Opcode
	masked bool
	key    [4]byte
	length int64
}

// readHeader decodes one frame header from r.
func readHeader(r io.Reader, buf []byte) (frameHeader, error) {
	var h frameHeader
	if _, err := io.ReadFull(r, buf[:2]); err != nil {
		return h, err
	}
	h.fin = buf[0]&0x80 != 0
	h.rsv = buf[0] & 0x70
	h.op = Opcode(buf[0] & 0x0f)
	h.masked = buf[1]&0x80 != 0
	n := int64(buf[1] & 0x7f)
	switch n {
	case 126:
		if _, err := io.ReadFull(r, buf[:2]); err != nil {
			return h, err
		}
		n = int64(binary.BigEndian.Uint16(buf[:2]))
		if n < 126 {
			return h, &ProtocolError{CloseProtocolError, "length not minimally encoded"}
		}
	case 127:
		if _, err := io.ReadFull(r, buf[:8]); err != nil {
			return h, err
		}
		u := binary.BigEndian.Uint64(buf[:8])
		if u>>63 != 0 {
			return h, &ProtocolError{CloseProtocolError, "frame length has its top bit set"}
		}
		n = int64(u)
		if n <= 0xffff {
			return h, &ProtocolError{CloseProtocolError, "length not minimally encoded"}
		}
	}
	h.length = n
	if h.masked {
		if _, err := io.ReadFull(r, h.key[:]); err != nil {
			return h, err
		}
	}
	return h, nil
}

// appendHeader encodes a frame header for a payload of n bytes.
func appendHeader(b []byte, fin bool, op Opcode, n int, key *[4]byte) []byte {
	b0 := byte(op)
	if fin {
		b0 |= 0x80
	}
	var m byte
	if key != nil {
		m = 0x80
	}
	switch {
	case n <= 125:
		b = append(b, b0, m|byte(n))
	case n <= 0xffff:
		b = append(b, b0, m|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, b0, m|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	if key != nil {
		b = append(b, key[:]...)
	}
	return b
}

// mask XORs b with key, starting at key offset pos, and returns the offset
// after b (RFC 6455 §5.3). It works a machine word at a time.
func mask(key [4]byte, pos int, b []byte) int {
	pos &= 3
	// Bring pos to 0 so the 8-byte word below lines up with the key.
	for pos != 0 && len(b) > 0 {
		b[0] ^= key[pos]
		b = b[1:]
		pos = (pos + 1) & 3
	}
	k32 := uint64(binary.LittleEndian.Uint32(key[:]))
	k64 := k32 | k32<<32
	for len(b) >= 8 {
		binary.LittleEndian.PutUint64(b, binary.LittleEndian.Uint64(b)^k64)
		b = b[8:]
	}
	for i := range b {
		b[i] ^= key[pos]
		pos = (pos + 1) & 3
	}
	return pos
}

// validCloseCode reports whether a peer may send code (RFC 6455 §7.4).
func validCloseCode(code int) bool {
	switch {
	case code >= 1000 && code <= 1003, code >= 1007 && code <= 1011:
		return true
	case code >= 3000 && code <= 4999:
		return true
	}
	return false
}

// Interface guards.
var (
	_ error = (*CloseError)(nil)
	_ error = (*ProtocolError)(nil)
)
