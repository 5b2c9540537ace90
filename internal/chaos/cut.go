package chaos

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
)

// cutter stands between one Caddy instance and Redis, so a scenario can
// cut that instance off (a partition, a paused VM's network) while its
// clients and workers still reach it: cut closes every connection through
// it and refuses new ones until mend.
type cutter struct {
	ln   net.Listener
	to   string
	mu   sync.Mutex
	down bool
	open map[net.Conn]struct{}
	wg   sync.WaitGroup
}

// newCutter listens on a free local port and forwards to the Redis of
// redisURL; it returns the URL to give the instance instead.
func newCutter(redisURL string) (*cutter, string, error) {
	u, err := url.Parse(redisURL)
	if err != nil || u.Host == "" {
		return nil, "", fmt.Errorf("cutting %q: not a single-node Redis URL", redisURL)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	c := &cutter{ln: ln, to: u.Host, open: map[net.Conn]struct{}{}}
	c.wg.Add(1)
	go c.accept()
	u.Host = ln.Addr().String()
	return c, u.String(), nil
}

func (c *cutter) accept() {
	defer c.wg.Done()
	for {
		in, err := c.ln.Accept()
		if err != nil {
			return
		}
		c.mu.Lock()
		if c.down {
			c.mu.Unlock()
			in.Close()
			continue
		}
		c.mu.Unlock()
		out, err := net.Dial("tcp", c.to)
		if err != nil {
			in.Close()
			continue
		}
		if !c.track(in, out) {
			continue
		}
		c.wg.Add(2)
		go c.pipe(in, out)
		go c.pipe(out, in)
	}
}

// track notes a connection pair, unless a cut came meanwhile.
func (c *cutter) track(a, b net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down {
		a.Close()
		b.Close()
		return false
	}
	c.open[a], c.open[b] = struct{}{}, struct{}{}
	return true
}

func (c *cutter) pipe(dst, src net.Conn) {
	defer c.wg.Done()
	// a cut, or either end gone: both ends close
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	c.mu.Lock()
	delete(c.open, dst)
	delete(c.open, src)
	c.mu.Unlock()
}

// cut closes every connection through the cutter and refuses new ones.
func (c *cutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = true
	for conn := range c.open {
		conn.Close()
	}
}

// mend lets connections through again.
func (c *cutter) mend() {
	c.mu.Lock()
	c.down = false
	c.mu.Unlock()
}

func (c *cutter) close() {
	c.ln.Close()
	c.cut()
	c.wg.Wait()
}
