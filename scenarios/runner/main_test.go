package runner

import (
	"os"
	"testing"

	"github.com/vmchaos/vmchaos/stackbin"
)

// TestMain removes the stack binaries stackbin built for this run (the
// failfast and manager tests ask for them; without this each run left a
// vmchaos-bin-* dir behind, which `vmchaos doctor --census` reports).
func TestMain(m *testing.M) {
	code := m.Run()
	stackbin.Cleanup()
	os.Exit(code)
}
