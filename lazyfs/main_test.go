package lazyfs

import (
	"os"
	"testing"

	"github.com/vmchaos/vmchaos/lazyfs/privatens"
)

func TestMain(m *testing.M) {
	if code, done := privatens.Reexec(); done {
		os.Exit(code)
	}
	os.Exit(m.Run())
}
