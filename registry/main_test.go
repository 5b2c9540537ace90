package registry

import (
	"os"
	"testing"
)

// TestMain runs the second process of the contention tests when the test
// binary re-executes itself for one (they need two real processes sharing
// a Redis), and the tests otherwise.
func TestMain(m *testing.M) {
	if url := os.Getenv("GRID_CONTENTION_URL"); url != "" {
		contentionHelper(url)
		os.Exit(0)
	}
	if url := os.Getenv("GRID_STAGGER_URL"); url != "" {
		staggerContentionHelper(url)
		os.Exit(0)
	}
	os.Exit(m.Run())
}
