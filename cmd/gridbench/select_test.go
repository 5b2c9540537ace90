package main

import (
	"slices"
	"testing"
)

// TestSelectSections: -only NAME runs the section of that name alone, and
// a word that names no section runs every section containing it.
func TestSelectSections(t *testing.T) {
	all := []section{{name: "selection"}, {name: "claim"}, {name: "redis-cpu"}, {name: "connect"}, {name: "relay"}, {name: "recycle"}}
	for _, c := range []struct {
		only string
		want []string
	}{
		{"", []string{"selection", "claim", "redis-cpu", "connect", "relay", "recycle"}},
		{"claim", []string{"claim"}},
		{"re", []string{"redis-cpu", "relay", "recycle"}},
		{"cpu", []string{"redis-cpu"}},
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
