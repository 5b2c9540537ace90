package registry

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// keysetNames are common.lua's names of the KEYS (keyset).
var keysetNames = []string{"workers", "state", "retiring", "lf", "ring", "idle", "busy", "iwrr", "sessions", "sindex", "groups"}

// luaFunc is one function of the library's Lua: a top-level local
// function, or a walk (WALKS.<name> = function).
type luaFunc struct {
	file, name string
	body       string
	// header is the comment block right above it.
	header string
}

var (
	luaFuncStart = regexp.MustCompile(`^(?:local function (\w+)\(|WALKS\.(\w+) = function\()`)
	luaKeyRef    = regexp.MustCompile(`\bK\.(\w+)`)
	luaCall      = regexp.MustCompile(`\b(\w+)\(`)
)

func readLuaFuncs(t *testing.T) []luaFunc {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("lua", "*.lua"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Lua files: %v", err)
	}
	var out []luaFunc
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(raw), "\n")
		var comment []string
		for i := 0; i < len(lines); i++ {
			line := lines[i]
			if strings.HasPrefix(line, "--") {
				comment = append(comment, line)
				continue
			}
			m := luaFuncStart.FindStringSubmatch(line)
			if m == nil {
				comment = nil
				continue
			}
			f := luaFunc{file: filepath.Base(file), name: m[1] + m[2], header: strings.Join(comment, "\n")}
			comment = nil
			body := []string{line}
			if !strings.HasSuffix(line, " end") { // not a one-line function
				for i++; i < len(lines) && lines[i] != "end"; i++ {
					body = append(body, lines[i])
				}
			}
			f.body = strings.Join(body, "\n")
			out = append(out, f)
		}
	}
	return out
}

// TestLuaHeadersNameTheKeysTheyUse keeps every Lua function's header true:
// a function whose header has a "KEYS:" list uses exactly those keys,
// itself or through the functions it calls.
func TestLuaHeadersNameTheKeysTheyUse(t *testing.T) {
	funcs := readLuaFuncs(t)
	byName := map[string]luaFunc{}
	for _, f := range funcs {
		byName[f.name] = f
	}
	// uses is the keys a function touches, through its calls too.
	memo := map[string]map[string]bool{}
	var uses func(name string, seen map[string]bool) map[string]bool
	uses = func(name string, seen map[string]bool) map[string]bool {
		if m, ok := memo[name]; ok {
			return m
		}
		f := byName[name]
		out := map[string]bool{}
		for _, m := range luaKeyRef.FindAllStringSubmatch(f.body, -1) {
			if slices.Contains(keysetNames, m[1]) {
				out[m[1]] = true
			}
		}
		// A walk is called through WALKS[policy]: the claim uses them all.
		if strings.Contains(f.body, "WALKS[") {
			for _, g := range funcs {
				if g.file != f.file && strings.HasPrefix(g.file, "walk_") && g.name == strings.TrimSuffix(strings.TrimPrefix(g.file, "walk_"), ".lua") {
					for k := range uses(g.name, seen) {
						out[k] = true
					}
				}
			}
		}
		for _, m := range luaCall.FindAllStringSubmatch(f.body, -1) {
			callee := m[1]
			if _, ok := byName[callee]; !ok || callee == name || seen[callee] {
				continue
			}
			seen[callee] = true
			for k := range uses(callee, seen) {
				out[k] = true
			}
		}
		memo[name] = out
		return out
	}
	checked := 0
	for _, f := range funcs {
		_, list, ok := strings.Cut(f.header, "KEYS:")
		if !ok {
			continue
		}
		list, _, _ = strings.Cut(list, "ARGV:")
		declared := map[string]bool{}
		for _, w := range regexp.MustCompile(`\w+`).FindAllString(list, -1) {
			if slices.Contains(keysetNames, w) {
				declared[w] = true
			}
		}
		used := uses(f.name, map[string]bool{f.name: true})
		checked++
		for _, k := range keysetNames {
			switch {
			case used[k] && !declared[k]:
				t.Errorf("%s: %s uses key %s, which its header's KEYS list does not name", f.file, f.name, k)
			case declared[k] && !used[k]:
				t.Errorf("%s: %s's header names key %s, which it does not use", f.file, f.name, k)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no function header has a KEYS list")
	}
}
