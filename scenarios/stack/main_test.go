package stack_test

import (
	"os"
	"testing"

	"github.com/vmchaos/vmchaos/stackbin"
)

// TestMain removes the stack binaries stackbin built for this run (the
// end-to-end cocoon test builds them when it runs).
func TestMain(m *testing.M) {
	code := m.Run()
	stackbin.Cleanup()
	os.Exit(code)
}
