package fsm

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind (raft nodes,
// blocking queries, watch sets).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
