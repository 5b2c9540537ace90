package caddybrowsergrid

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// ourModules lists the Caddy modules this project registers, found by the
// package path of each module's type.
func ourModules() []string {
	var ids []string
	for _, id := range caddy.Modules() {
		m, err := caddy.GetModule(id)
		if err != nil {
			continue
		}
		typ := reflect.TypeOf(m.New())
		for typ.Kind() == reflect.Pointer {
			typ = typ.Elem()
		}
		if strings.HasPrefix(typ.PkgPath(), "github.com/browsergrid/caddy-browser-grid") {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// TestXcaddyBuild builds Caddy the way users do, with
// 'xcaddy build --with github.com/browsergrid/caddy-browser-grid=.'
// (through 'make xcaddy'), and checks that the result lists every module
// this package registers.
func TestXcaddyBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("xcaddy build takes minutes; not in -short")
	}
	want := ourModules()
	if len(want) == 0 {
		t.Fatal("the root package registers no Caddy modules")
	}
	testenv.LookPath(t, "make")
	root := testenv.RepoRoot(t)
	out, err := exec.Command("make", "-C", root, "xcaddy").CombinedOutput()
	if err != nil {
		t.Fatalf("make xcaddy: %v\n%s", err, out)
	}
	bin := filepath.Join(root, "bin", "xcaddy", "caddy")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("make xcaddy did not produce %s: %v", bin, err)
	}
	listed, err := exec.Command(bin, "list-modules").CombinedOutput()
	if err != nil {
		t.Fatalf("%s list-modules: %v\n%s", bin, err, listed)
	}
	have := map[string]bool{}
	for _, line := range strings.Split(string(listed), "\n") {
		have[strings.TrimSpace(line)] = true
	}
	for _, id := range want {
		if !have[id] {
			t.Errorf("xcaddy-built caddy does not list module %s", id)
		}
	}
	t.Logf("xcaddy-built caddy lists all %d modules of this project: %s", len(want), strings.Join(want, ", "))
}
