package main

import (
	"os"
	"testing"

	"github.com/vmchaos/vmchaos/stackbin"
)

// envAsVmchaos makes the test binary run as vmchaos itself, so a test can
// start (and SIGKILL) a real runner process without building one.
const envAsVmchaos = "VMCHAOS_TEST_AS_VMCHAOS"

func TestMain(m *testing.M) {
	if os.Getenv(envAsVmchaos) == "1" {
		main()
		os.Exit(0)
	}
	code := m.Run()
	stackbin.Cleanup() // binaries stackbin built for this run
	os.Exit(code)
}
