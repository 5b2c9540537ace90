package caddybrowsergrid

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The house rules a newcomer relies on, checked so they stay true: tests
// are named by the behaviour they hold, user docs are reference without a
// lab notebook's history, and comments say why in the present.

// trackedFiles lists the files git tracks (and new ones not ignored), or
// skips when this is no git checkout.
func trackedFiles(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v (the rules read the checkout's files)", err)
	}
	var files []string
	for _, f := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if _, err := os.Stat(f); err == nil {
			files = append(files, f)
		}
	}
	return files
}

// historyWords are how a review or a fix's history shows up in prose.
var historyWords = regexp.MustCompile(`(?i)\bred[ -]?team|\breview (round|measured|found)|\ba review\b|\brev[0-9]\b|\ba first version\b|\bused to be\b`)

// TestTestsAreNamedByBehaviour: no test file or test named after who found
// a bug or which review round wrote it.
func TestTestsAreNamedByBehaviour(t *testing.T) {
	badFile := regexp.MustCompile(`(?i)(^|_)(red[0-9]*|rev[0-9]*|review[0-9]*|round[0-9]+)(_|\.)`)
	badName := regexp.MustCompile(`(?m)^func (Test|Benchmark|Fuzz)(Red|Rev|Review)[A-Z0-9_]`)
	for _, f := range trackedFiles(t) {
		if !strings.HasSuffix(f, "_test.go") {
			continue
		}
		if badFile.MatchString(filepath.Base(f)) {
			t.Errorf("%s: a test file is named by the behaviour it tests, not by who wrote it", f)
		}
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range badName.FindAllString(string(raw), -1) {
			t.Errorf("%s: %q: a test is named by the behaviour it holds", f, m)
		}
	}
}

// TestUserDocsAreReference: the README, CHANGELOG and docs/ name no
// commit, date, test, temp path, red team or review. docs/development.md,
// the contributors' page, may name tests.
func TestUserDocsAreReference(t *testing.T) {
	out, err := exec.Command("git", "rev-list", "--all").Output()
	if err != nil {
		t.Fatalf("git rev-list: %v", err)
	}
	commits := strings.Fields(string(out))
	hexWord := regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)
	date := regexp.MustCompile(`\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b`)
	testName := regexp.MustCompile(`\b(Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9]+`)
	tmpPath := regexp.MustCompile(`/tmp/[A-Za-z0-9]`)
	pages, _ := filepath.Glob(filepath.Join("docs", "*.md"))
	pages = append(pages, "README.md", "CHANGELOG.md")
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		text := string(raw)
		for _, w := range hexWord.FindAllString(text, -1) {
			for _, c := range commits {
				if strings.HasPrefix(c, w) {
					t.Errorf("%s names commit %s", page, w)
					break
				}
			}
		}
		for _, re := range []*regexp.Regexp{date, tmpPath, historyWords} {
			for _, m := range re.FindAllString(text, -1) {
				t.Errorf("%s: %q: user docs say what is, not when or who found it", page, m)
			}
		}
		if filepath.Base(page) != "development.md" {
			for _, m := range testName.FindAllString(text, -1) {
				t.Errorf("%s names the test %s: user docs give the command a user runs", page, m)
			}
		}
	}
}

// TestCommentsSayWhyInThePresent: no Go or Lua comment tells a fix's
// history or names a review.
func TestCommentsSayWhyInThePresent(t *testing.T) {
	comment := regexp.MustCompile(`(//|--)(.*)$`)
	for _, f := range trackedFiles(t) {
		if !strings.HasSuffix(f, ".go") && !strings.HasSuffix(f, ".lua") && !strings.HasSuffix(f, ".mjs") || f == "rules_test.go" {
			continue // this file names the words it looks for
		}
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(raw), "\n") {
			m := comment.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			if h := historyWords.FindString(m[2]); h != "" {
				t.Errorf("%s:%d: %q: a comment says why, in the present", f, i+1, h)
			}
		}
	}
}
