package wsock

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// keyGUID is the fixed GUID of RFC 6455 §1.3 that the accept hash mixes in.
const keyGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// AcceptKey computes Sec-WebSocket-Accept for a Sec-WebSocket-Key.
func AcceptKey(key string) string {
	h := sha1.Sum([]byte(key + keyGUID))
	return base64.StdEncoding.EncodeToString(h[:])
}

// headerHasToken reports whether a comma-separated header holds token,
// compared case-insensitively (Connection: keep-alive, Upgrade).
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// IsUpgrade reports whether r asks for a WebSocket upgrade.
func IsUpgrade(r *http.Request) bool {
	return headerHasToken(r.Header, "Connection", "upgrade") && headerHasToken(r.Header, "Upgrade", "websocket")
}

// Upgrader is the server side of the opening handshake.
type Upgrader struct {
	// MaxMessageSize is the read limit of accepted connections, in bytes.
	// Default: 32 MiB.
	MaxMessageSize int64
	// Header is added to every 101 response (e.g. Sec-WebSocket-Protocol).
	Header http.Header
}

// Upgrade answers a WebSocket handshake with 101 and takes over the
// connection. When the request is not a valid handshake it answers 400 (or
// 426 for an unsupported version, 405 for a method other than GET) and
// returns an error saying why; the caller writes nothing more.
func (u *Upgrader) Upgrade(w http.ResponseWriter, r *http.Request) (*Conn, error) {
	fail := func(status int, msg string) (*Conn, error) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if status == http.StatusUpgradeRequired {
			w.Header().Set("Sec-WebSocket-Version", "13")
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, msg+"\n")
		return nil, errors.New("wsock: refusing upgrade: " + msg)
	}
	if r.Method != http.MethodGet {
		return fail(http.StatusMethodNotAllowed, "a websocket handshake must be a GET")
	}
	if !r.ProtoAtLeast(1, 1) {
		return fail(http.StatusBadRequest, "a websocket handshake needs HTTP/1.1")
	}
	if !IsUpgrade(r) {
		return fail(http.StatusBadRequest, "missing 'Connection: Upgrade' and 'Upgrade: websocket'")
	}
	if r.Header.Get("Sec-WebSocket-Version") != "13" {
		return fail(http.StatusUpgradeRequired, "unsupported Sec-WebSocket-Version (want 13)")
	}
	key := r.Header.Get("Sec-WebSocket-Key")
	if raw, err := base64.StdEncoding.DecodeString(key); err != nil || len(raw) != 16 {
		return fail(http.StatusBadRequest, "Sec-WebSocket-Key is not 16 base64-encoded bytes")
	}
	nc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return fail(http.StatusInternalServerError, "connection cannot be taken over: "+err.Error())
	}
	// The HTTP server may have set deadlines for the request; a WebSocket
	// lives as long as its peers want.
	_ = nc.SetDeadline(time.Time{})
	var b strings.Builder
	b.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ")
	b.WriteString(AcceptKey(key))
	b.WriteString("\r\n")
	for k, vs := range u.Header {
		for _, v := range vs {
			if strings.ContainsAny(k+v, "\r\n") {
				continue // never let a header value split the response
			}
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(nc, b.String()); err != nil {
		nc.Close()
		return nil, fmt.Errorf("wsock: writing the 101 response: %w", err)
	}
	return newConn(nc, brw.Reader, false, u.MaxMessageSize), nil
}

// Upgrade is (&Upgrader{}).Upgrade.
func Upgrade(w http.ResponseWriter, r *http.Request) (*Conn, error) {
	return (&Upgrader{}).Upgrade(w, r)
}

// HandshakeError is returned by Dial when the server answered the upgrade
// request with something other than 101.
type HandshakeError struct {
	StatusCode int
	Status     string
	Header     http.Header
	// Body is the start of the response body (at most Dialer.MaxErrorBody).
	Body []byte
}

func (e *HandshakeError) Error() string {
	body := strings.TrimSpace(string(e.Body))
	if len(body) > 200 {
		body = body[:200] + "…"
	}
	if body == "" {
		return "websocket upgrade refused: " + e.Status
	}
	return fmt.Sprintf("websocket upgrade refused: %s: %s", e.Status, body)
}

// Dialer opens client connections.
type Dialer struct {
	// TLSConfig for wss:// URLs; ServerName defaults to the URL's host.
	// Default: the system roots.
	TLSConfig *tls.Config
	// Header is sent with the upgrade request (Authorization, Origin,
	// Sec-WebSocket-Protocol, ...). A "Host" entry overrides the Host
	// header.
	Header http.Header
	// NetDial replaces the TCP dial. Default: a net.Dialer.
	NetDial func(ctx context.Context, network, addr string) (net.Conn, error)
	// HandshakeTimeout bounds the dial, TLS and HTTP handshake when ctx has
	// no earlier deadline. Default: 30s.
	HandshakeTimeout time.Duration
	// MaxMessageSize is the read limit of the connection, in bytes.
	// Default: 32 MiB.
	MaxMessageSize int64
	// MaxErrorBody is how much of a refusal's body is kept, in bytes.
	// Default: 64 KiB.
	MaxErrorBody int64
}

// Dial is (&Dialer{Header: header}).Dial.
func Dial(ctx context.Context, rawURL string, header http.Header) (*Conn, *http.Response, error) {
	return (&Dialer{Header: header}).Dial(ctx, rawURL)
}

// Dial connects to a ws:// or wss:// URL and runs the opening handshake.
// The response is returned whenever the server answered (its Body already
// read and closed); a refusal is a *HandshakeError carrying the status and
// the body.
func (d *Dialer) Dial(ctx context.Context, rawURL string) (*Conn, *http.Response, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("wsock: parsing URL: %w", err)
	}
	var secure bool
	switch u.Scheme {
	case "ws", "http":
	case "wss", "https":
		secure = true
	default:
		return nil, nil, fmt.Errorf("wsock: URL %q: scheme must be ws or wss", rawURL)
	}
	if u.Host == "" {
		return nil, nil, fmt.Errorf("wsock: URL %q has no host", rawURL)
	}
	addr := u.Host
	if u.Port() == "" {
		port := "80"
		if secure {
			port = "443"
		}
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	timeout := d.HandshakeTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	dial := d.NetDial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	nc, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("wsock: dialing %s: %w", addr, err)
	}
	// Until the handshake is done, the context's end closes the connection.
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	ok := false
	defer func() {
		if !ok {
			stop()
			nc.Close()
		}
	}()
	if secure {
		cfg := &tls.Config{}
		if d.TLSConfig != nil {
			cfg = d.TLSConfig.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = u.Hostname()
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, nil, fmt.Errorf("wsock: TLS handshake with %s: %w", addr, err)
		}
		nc = tc
	}

	var rawKey [16]byte
	if _, err := rand.Read(rawKey[:]); err != nil {
		return nil, nil, err
	}
	key := base64.StdEncoding.EncodeToString(rawKey[:])
	req := &http.Request{
		Method:     http.MethodGet,
		URL:        &url.URL{Path: u.Path, RawPath: u.RawPath, RawQuery: u.RawQuery},
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     make(http.Header),
		Host:       u.Host,
	}
	if req.URL.Path == "" {
		req.URL.Path = "/"
	}
	for k, vs := range d.Header {
		if http.CanonicalHeaderKey(k) == "Host" {
			if len(vs) > 0 {
				req.Host = vs[0]
			}
			continue
		}
		req.Header[http.CanonicalHeaderKey(k)] = append([]string(nil), vs...)
	}
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", "wsock")
	}
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Sec-WebSocket-Key", key)
	req.Header.Set("Sec-WebSocket-Version", "13")
	if u.User != nil {
		pw, _ := u.User.Password()
		req.SetBasicAuth(u.User.Username(), pw)
	}
	if err := req.Write(nc); err != nil {
		return nil, nil, fmt.Errorf("wsock: writing the upgrade request to %s: %w", addr, err)
	}
	br := bufio.NewReaderSize(nc, 4096)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, nil, fmt.Errorf("wsock: reading the upgrade response from %s: %w", addr, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		limit := d.MaxErrorBody
		if limit <= 0 {
			limit = 64 << 10
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, limit))
		resp.Body.Close()
		resp.Body = io.NopCloser(strings.NewReader(string(body)))
		return nil, resp, &HandshakeError{StatusCode: resp.StatusCode, Status: resp.Status, Header: resp.Header, Body: body}
	}
	resp.Body = http.NoBody
	switch {
	case !headerHasToken(resp.Header, "Upgrade", "websocket"):
		return nil, resp, errors.New("wsock: 101 response without 'Upgrade: websocket'")
	case !headerHasToken(resp.Header, "Connection", "upgrade"):
		return nil, resp, errors.New("wsock: 101 response without 'Connection: Upgrade'")
	case resp.Header.Get("Sec-WebSocket-Accept") != AcceptKey(key):
		return nil, resp, errors.New("wsock: 101 response with a wrong Sec-WebSocket-Accept")
	case resp.Header.Get("Sec-WebSocket-Extensions") != "":
		return nil, resp, errors.New("wsock: server negotiated an extension this client does not support: " + resp.Header.Get("Sec-WebSocket-Extensions"))
	}
	if !stop() {
		return nil, resp, fmt.Errorf("wsock: handshake with %s: %w", addr, ctx.Err())
	}
	ok = true
	return newConn(nc, br, true, d.MaxMessageSize), resp, nil
}

// Interface guards.
var _ error = (*HandshakeError)(nil)
