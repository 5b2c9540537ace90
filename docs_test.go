package caddybrowsergrid

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsLinksResolve keeps the README and the pages under docs/ and
// docs/perf/ linked together: every relative link must name a file of the checkout, and a
// link with an anchor (page.md#section) must name a heading of that page,
// slugged as GitHub slugs headings. External links (https:, mailto:) are
// not followed.
func TestDocsLinksResolve(t *testing.T) {
	pages, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatalf("listing docs/: %v", err)
	}
	perf, err := filepath.Glob(filepath.Join("docs", "perf", "*.md"))
	if err != nil {
		t.Fatalf("listing docs/perf/: %v", err)
	}
	pages = append(append([]string{"README.md"}, pages...), perf...)
	anchors := map[string]map[string]bool{}
	headingsOf := func(page string) (map[string]bool, error) {
		if a, ok := anchors[page]; ok {
			return a, nil
		}
		raw, err := os.ReadFile(page)
		if err != nil {
			return nil, err
		}
		a := headingSlugs(string(raw))
		anchors[page] = a
		return a, nil
	}
	links := 0
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatalf("reading %s: %v", page, err)
		}
		for _, target := range markdownLinks(string(raw)) {
			if regexp.MustCompile(`^[a-z]+:`).MatchString(target) {
				continue
			}
			links++
			path, anchor, _ := strings.Cut(target, "#")
			full := page
			if path != "" {
				full = filepath.Join(filepath.Dir(page), filepath.FromSlash(path))
			}
			if _, err := os.Stat(full); err != nil {
				t.Errorf("%s links to %s: %v", page, target, err)
				continue
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(full, ".md") {
				t.Errorf("%s links to %s: an anchor on a file that is not a markdown page", page, target)
				continue
			}
			a, err := headingsOf(full)
			if err != nil {
				t.Errorf("%s links to %s: %v", page, target, err)
				continue
			}
			if !a[anchor] {
				t.Errorf("%s links to %s: %s has no heading with the anchor #%s", page, target, full, anchor)
			}
		}
	}
	if links == 0 {
		t.Fatal("found no relative links at all: the link pattern no longer matches the pages")
	}
}

var (
	linkPattern    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingPattern = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*$`)
	slugDrop       = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
	inlineLink     = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// markdownLinks returns the targets of the page's [text](target) links,
// outside fenced code blocks.
func markdownLinks(page string) []string {
	var out []string
	for _, line := range outsideFences(page) {
		for _, m := range linkPattern.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// headingSlugs returns the anchors GitHub gives the page's headings:
// lowercased, punctuation dropped, spaces to hyphens, a repeated slug
// suffixed -1, -2, ...
func headingSlugs(page string) map[string]bool {
	slugs := map[string]bool{}
	seen := map[string]int{}
	for _, line := range outsideFences(page) {
		m := headingPattern.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := inlineLink.ReplaceAllString(strings.ToLower(m[1]), "$1")
		s = strings.ReplaceAll(slugDrop.ReplaceAllString(s, ""), " ", "-")
		if n := seen[s]; n > 0 {
			slugs[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			slugs[s] = true
		}
		seen[s]++
	}
	return slugs
}

// outsideFences returns the page's lines that are not inside a ``` block.
func outsideFences(page string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line)
		}
	}
	return out
}
