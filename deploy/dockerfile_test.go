package deploy

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

// instruction is one parsed Dockerfile line: its keyword, its arguments,
// and whether it used the JSON (exec) form.
type instruction struct {
	cmd  string
	args []string
	json bool
	line int
	raw  string
}

// stage is one FROM and what follows it.
type stage struct {
	from  string
	name  string
	instr []instruction
}

// parseDockerfile parses a Dockerfile with BuildKit's own parser (the one
// `docker build` runs) and groups its instructions by stage.
func parseDockerfile(t *testing.T, path string) []stage {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, w := range res.Warnings {
		t.Errorf("%s: BuildKit warns: %s", path, w.Short)
	}
	var stages []stage
	for _, n := range res.AST.Children {
		in := instruction{cmd: strings.ToUpper(n.Value), json: n.Attributes["json"], line: n.StartLine, raw: n.Original}
		for a := n.Next; a != nil; a = a.Next {
			in.args = append(in.args, a.Value)
		}
		if in.cmd == "FROM" {
			s := stage{from: in.args[0]}
			if len(in.args) == 3 && strings.EqualFold(in.args[1], "AS") {
				s.name = in.args[2]
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Errorf("%s:%d: %s before the first FROM", path, in.line, in.cmd)
			}
			continue
		}
		stages[len(stages)-1].instr = append(stages[len(stages)-1].instr, in)
	}
	if len(stages) == 0 {
		t.Fatalf("%s: no FROM", path)
	}
	return stages
}

func (s stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range s.instr {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

func (s stage) last(cmd string) (instruction, bool) {
	all := s.all(cmd)
	if len(all) == 0 {
		return instruction{}, false
	}
	return all[len(all)-1], true
}

func (s stage) runs(substr string) bool {
	for _, in := range s.all("RUN") {
		if strings.Contains(strings.Join(in.args, " "), substr) {
			return true
		}
	}
	return false
}

// checkFinalStage checks what every image here needs: a Debian base, a
// non-root user, SIGTERM as the stop signal and an exec-form entrypoint (a
// shell form would put /bin/sh in front, which does not pass SIGTERM on).
func checkFinalStage(t *testing.T, path string, final stage) instruction {
	t.Helper()
	if !strings.HasPrefix(final.from, "debian:") {
		t.Errorf("%s: final image FROM %s, want Debian", path, final.from)
	}
	if u, ok := final.last("USER"); !ok {
		t.Errorf("%s: no USER: the image would run as root", path)
	} else if user := strings.Split(u.args[0], ":")[0]; user == "root" || user == "0" {
		t.Errorf("%s: USER %s is root", path, u.args[0])
	} else if regexp.MustCompile(`^[0-9]+$`).MatchString(user) &&
		!regexp.MustCompile(`useradd\b[^\n]*--uid `+user+`\b`).MatchString(runText(final)) {
		// A numeric user (which runAsNonRoot can check) needs an account:
		// Chromium wants a home directory.
		t.Errorf("%s: USER %s, but the final stage creates no user with that uid (useradd --uid %s)", path, u.args[0], user)
	}
	if s, ok := final.last("STOPSIGNAL"); !ok || s.args[0] != "SIGTERM" {
		t.Errorf("%s: want STOPSIGNAL SIGTERM (got %v)", path, s.args)
	}
	ep, ok := final.last("ENTRYPOINT")
	if !ok {
		t.Fatalf("%s: no ENTRYPOINT", path)
	}
	if !ep.json {
		t.Errorf("%s:%d: ENTRYPOINT in shell form (%s): use the exec form [\"...\"]", path, ep.line, ep.raw)
	}
	if c, ok := final.last("CMD"); ok && !c.json {
		t.Errorf("%s:%d: CMD in shell form (%s)", path, c.line, c.raw)
	}
	return ep
}

// copiedTo reports whether the stage copies something to dest.
func (s stage) copiedTo(dest string) bool {
	for _, in := range s.all("COPY") {
		if len(in.args) > 0 && strings.TrimSuffix(in.args[len(in.args)-1], "/") == strings.TrimSuffix(dest, "/") {
			return true
		}
	}
	return false
}

func TestWorkerDockerfile(t *testing.T) {
	const path = "worker.Dockerfile"
	help := gridWorkerHelp(t)
	stages := parseDockerfile(t, path)
	final := stages[len(stages)-1]
	ep := checkFinalStage(t, path, final)

	if len(ep.args) == 0 || !strings.HasSuffix(ep.args[0], "/grid-worker") {
		t.Errorf("%s: ENTRYPOINT %v does not run grid-worker (it must be the process that gets SIGTERM)", path, ep.args)
	} else if !final.copiedTo(ep.args[0]) {
		t.Errorf("%s: ENTRYPOINT %s, but the final stage copies nothing there", path, ep.args[0])
	}
	for _, a := range ep.args[1:] {
		if f, ok := strings.CutPrefix(a, "-"); ok && !help.flags[strings.Split(f, "=")[0]] {
			t.Errorf("%s: flag %s is not a grid-worker flag", path, a)
		}
	}

	// grid-worker comes from a Go stage built from this repository.
	goStage := false
	for _, s := range stages[:len(stages)-1] {
		if strings.HasPrefix(s.from, "golang:") && s.runs("go build") && s.runs("./cmd/grid-worker") {
			goStage = true
		}
	}
	if !goStage {
		t.Errorf("%s: no golang stage running go build ./cmd/grid-worker", path)
	}
	// playwright/ with its locked node_modules, from npm ci.
	npm := false
	for _, s := range stages {
		if s.runs("npm ci") {
			npm = true
		}
	}
	if !npm {
		t.Errorf("%s: no stage runs npm ci for playwright/", path)
	}
	if !final.copiedTo("/opt/grid/playwright") {
		t.Errorf("%s: the final stage does not copy playwright/ to /opt/grid/playwright", path)
	}
	// The build context is the repository root: what make build and make
	// deps-node leave there must stay out of it, or COPY playwright/ would
	// replace the image's node_modules with the host's.
	ignore, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Errorf("%s: the build context has no .dockerignore: %v", path, err)
	}
	for _, want := range []string{"playwright/node_modules/", "bin/"} {
		if !regexp.MustCompile(`(?m)^/?` + regexp.QuoteMeta(want) + `?\s*$`).Match(ignore) {
			t.Errorf("%s: ../.dockerignore does not leave out %s", path, want)
		}
	}
	// Debian's Chromium, its headless shell and Node in the final image.
	for _, pkg := range []string{"chromium", "chromium-headless-shell", "nodejs"} {
		if !final.runs("apt-get install") || !regexp.MustCompile(`\b`+pkg+`\b`).MatchString(runText(final)) {
			t.Errorf("%s: the final stage does not apt-get install %s", path, pkg)
		}
	}

	// Every ENV of the final stage is a grid-worker variable.
	var names []string
	env := map[string]string{}
	for _, in := range final.all("ENV") {
		// BuildKit's parser gives ENV as name, value, "=" triples.
		for i := 0; i+1 < len(in.args); i += 3 {
			names = append(names, in.args[i])
			env[in.args[i]] = in.args[i+1]
		}
	}
	if len(names) == 0 {
		t.Errorf("%s: no ENV found", path)
	}
	help.checkEnv(t, path, names)
	if env["GRID_WORKER_HOST"] != "0.0.0.0" {
		t.Errorf("%s: GRID_WORKER_HOST %q: the agent must listen beyond the container's loopback", path, env["GRID_WORKER_HOST"])
	}
	if s := env["PLAYWRIGHT_LAUNCH_SCRIPT"]; !strings.HasPrefix(s, "/opt/grid/playwright/") {
		t.Errorf("%s: PLAYWRIGHT_LAUNCH_SCRIPT %q is not in the copied playwright/", path, s)
	}
}

func runText(s stage) string {
	var b strings.Builder
	for _, in := range s.all("RUN") {
		b.WriteString(strings.Join(in.args, " ") + "\n")
	}
	return b.String()
}

func TestCaddyDockerfile(t *testing.T) {
	const path = "caddy.Dockerfile"
	stages := parseDockerfile(t, path)
	final := stages[len(stages)-1]
	ep := checkFinalStage(t, path, final)
	if len(ep.args) == 0 || !strings.HasSuffix(ep.args[0], "/caddy") || !final.copiedTo(ep.args[0]) {
		t.Errorf("%s: ENTRYPOINT %v is not the caddy the final stage copies", path, ep.args)
	}

	// xcaddy builds this module from the build context, at the Caddy
	// version the module requires.
	goMod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*github\.com/caddyserver/caddy/v2 (v\S+)`).FindSubmatch(goMod)
	if m == nil {
		t.Fatal("../go.mod does not require github.com/caddyserver/caddy/v2")
	}
	built := false
	for _, s := range stages[:len(stages)-1] {
		text := runText(s)
		if strings.HasPrefix(s.from, "golang:") && strings.Contains(text, "xcaddy build") &&
			strings.Contains(text, "--with github.com/browsergrid/caddy-browser-grid=.") {
			built = true
			if !strings.Contains(text, "xcaddy build "+string(m[1])) {
				t.Errorf("%s: xcaddy does not build Caddy %s, the version ../go.mod requires", path, m[1])
			}
		}
	}
	if !built {
		t.Errorf("%s: no golang stage runs xcaddy build --with github.com/browsergrid/caddy-browser-grid=.", path)
	}
}
