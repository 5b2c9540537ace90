package testenv

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
)

// A port taken between the pick and the child's bind (another package's
// test took it) costs a retry on another port, not a failed test, and the
// server the test gets is its own, not whatever holds the taken port.
func TestStartRedisRetriesATakenPort(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	taken := held.Addr().(*net.TCPAddr).Port
	picks := 0
	pickPort = func(t testing.TB, bus bool) int {
		picks++
		if picks == 1 {
			return taken
		}
		return pickFreePort(t, bus)
	}
	defer func() { pickPort = pickFreePort }()

	r := StartRedis(t)
	if r.Port == taken || picks != 2 {
		t.Fatalf("started on port %d after %d picks; want a second pick, not the taken port %d", r.Port, picks, taken)
	}
	info, err := r.Client().Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info, "process_id:"+strconv.Itoa(r.Pid())+"\r\n") {
		t.Fatalf("the server on %s is not the child started (pid %d):\n%s", r.Addr, r.Pid(), info)
	}
}
