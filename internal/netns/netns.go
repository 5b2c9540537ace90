// Package netns makes hosts of their own for tests: network namespaces
// joined to the root one, whose link can be pulled.
package netns

import (
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"time"
)

// Host is a network namespace joined to the root one by a veth pair:
// a host of its own, for tests of a host that cannot reach another. What
// runs in the root namespace on Service serves both, and cutting the veth
// cuts only the namespace.
type Host struct {
	// Name is the namespace's, for ip netns exec.
	Name string
	// Outside is the root namespace's address on the link, Inside the
	// namespace's, Service an address of the root namespace's loopback
	// the namespace reaches over the link.
	Outside, Inside, Service string
	vethOut                  string
}

var hostSeq atomic.Int64

// New makes a namespace (root only: ip netns, iproute2).
func New() (*Host, error) {
	n := hostSeq.Add(1)
	subnet := 10 + int(time.Now().UnixNano()%200)
	h := &Host{
		Name:    fmt.Sprintf("gridtest-%d-%d", subnet, n),
		Outside: fmt.Sprintf("10.%d.%d.1", 200+int(n%50), subnet), Inside: fmt.Sprintf("10.%d.%d.2", 200+int(n%50), subnet),
		Service: fmt.Sprintf("10.%d.%d.100", 200+int(n%50), subnet),
		vethOut: fmt.Sprintf("gc%dx%d", subnet, n),
	}
	vethIn := h.vethOut + "i"
	steps := [][]string{
		{"netns", "add", h.Name},
		{"link", "add", h.vethOut, "type", "veth", "peer", "name", vethIn},
		{"link", "set", vethIn, "netns", h.Name},
		{"addr", "add", h.Outside + "/24", "dev", h.vethOut},
		{"link", "set", h.vethOut, "up"},
		{"netns", "exec", h.Name, "ip", "addr", "add", h.Inside + "/24", "dev", vethIn},
		{"netns", "exec", h.Name, "ip", "link", "set", vethIn, "up"},
		{"netns", "exec", h.Name, "ip", "link", "set", "lo", "up"},
		{"addr", "add", h.Service + "/32", "dev", "lo"},
		{"netns", "exec", h.Name, "ip", "route", "add", h.Service + "/32", "via", h.Outside},
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			h.Remove()
			return nil, fmt.Errorf("ip %s: %w: %s (network namespaces need root and iproute2)", strings.Join(s, " "), err, out)
		}
	}
	return h, nil
}

// Cut pulls the host's link: nothing crosses it, nothing is told.
func (h *Host) Cut() error {
	out, err := exec.Command("ip", "link", "set", h.vethOut, "down").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip link set %s down: %w: %s", h.vethOut, err, out)
	}
	return nil
}

func (h *Host) Remove() {
	_ = exec.Command("ip", "addr", "del", h.Service+"/32", "dev", "lo").Run()
	_ = exec.Command("ip", "link", "del", h.vethOut).Run()
	_ = exec.Command("ip", "netns", "del", h.Name).Run()
}
