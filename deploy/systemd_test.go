package deploy

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/unit"
)

// The systemd unit in docs/operations.md is the deploy file of operators
// without containers: parsed with go-systemd's unit parser, its flags and
// variables must be grid-worker's, it must signal the agent alone, and its
// TimeoutStopSec must outlast the longest stop.
func TestSystemdUnitInTheDocs(t *testing.T) {
	const page = "../docs/operations.md"
	text, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```ini\n(# /etc/systemd/system/grid-worker@\\.service.*?)```").FindSubmatch(text)
	if m == nil {
		t.Fatalf("%s: no ```ini block with the grid-worker@.service unit", page)
	}
	opts, err := unit.DeserializeOptions(strings.NewReader(string(m[1])))
	if err != nil {
		t.Fatalf("%s: the unit does not parse: %v", page, err)
	}
	help := gridWorkerHelp(t)
	env := map[string]string{}
	var names []string
	service := map[string]string{}
	for _, o := range opts {
		if o.Section != "Service" {
			continue
		}
		service[o.Name] = o.Value
		switch o.Name {
		case "Environment":
			// systemd takes several assignments on one line, quoted
			// when a value has spaces; this check reads plain ones.
			if strings.ContainsAny(o.Value, `"'\\`) {
				t.Errorf("%s: Environment=%s: write plain assignments (this check does not read quotes or escapes)", page, o.Value)
			}
			for _, kv := range strings.Fields(o.Value) {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
				names = append(names, k)
			}
		case "EnvironmentFile":
			t.Errorf("%s: EnvironmentFile=%s: this check cannot see what it sets (DRAIN_TIMEOUT), so the unit sets its variables itself", page, o.Value)
		}
	}
	help.checkEnv(t, page, names)
	args := strings.Fields(service["ExecStart"])[1:]
	for _, a := range args {
		if f, ok := strings.CutPrefix(a, "-"); ok {
			f, _, _ = strings.Cut(strings.TrimPrefix(f, "-"), "=")
			if !help.flags[f] {
				t.Errorf("%s: ExecStart flag %s is not a grid-worker flag", page, a)
			}
		}
	}
	if service["KillMode"] != "mixed" {
		t.Errorf("%s: KillMode %q; mixed sends SIGTERM to the agent alone, so the browser keeps its sessions through the drain", page, service["KillMode"])
	}
	v, ok := service["TimeoutStopSec"]
	if !ok {
		t.Fatalf("%s: no TimeoutStopSec (systemd's default 90s may be set lower on the host)", page)
	}
	grace, err := workerDuration(v)
	if err != nil {
		t.Fatalf("%s: TimeoutStopSec %q: %v", page, v, err)
	}
	help.checkStopGrace(t, page, "TimeoutStopSec", grace, env, args)
}
