package main

import (
	"slices"
	"testing"
)

// TestSelectSections: -only NAME runs the section of that name alone
// (docs/redis.md: "bin/gridbench -only registry, about 15 s" must not also
// run registry-bounds), and a word that names no section runs every
// section containing it.
func TestSelectSections(t *testing.T) {
	all := []section{{name: "selection"}, {name: "registry"}, {name: "registry-bounds"}, {name: "proxy"}, {name: "redis-targets"}, {name: "redis-profile"}}
	for _, c := range []struct {
		only string
		want []string
	}{
		{"", []string{"selection", "registry", "registry-bounds", "proxy", "redis-targets", "redis-profile"}},
		{"registry", []string{"registry"}},
		{"bounds", []string{"registry-bounds"}},
		{"redis", []string{"redis-targets", "redis-profile"}},
		{"nothing", nil},
	} {
		var got []string
		for _, s := range selectSections(all, c.only) {
			got = append(got, s.name)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("-only %q runs %v, want %v", c.only, got, c.want)
		}
	}
}
