package registry

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Another library holding one of the registry's function names (a
// leftover, or a hostile writer's): the library cannot load, and the
// error says which function is taken, rather than the call's "Function
// not found". (A call of the taken name itself runs the other library's
// code: only FUNCTION permissions keep a writer from that.)
func TestFunctionNameTakenByAnotherLibrary(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	taken := LibraryName() + "_register"
	src := "#!lua name=squatter\nredis.register_function('" + taken + "', function() return 1 end)\n"
	if err := rdb.(*redis.Client).FunctionLoad(ctx, src).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst})
	if err == nil || !strings.Contains(err.Error(), "loading function library "+LibraryName()) || !strings.Contains(err.Error(), taken+" already exists") {
		t.Fatalf("a claim while another library holds %s: %v; want the load's error naming it", taken, err)
	}
}
