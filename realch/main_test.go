package realch

import (
	"os"
	"testing"

	"github.com/vmchaos/vmchaos/stackbin"
)

// TestMain removes the stack binaries stackbin built for this run.
func TestMain(m *testing.M) {
	code := m.Run()
	stackbin.Cleanup()
	os.Exit(code)
}
