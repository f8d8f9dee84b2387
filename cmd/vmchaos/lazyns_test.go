package main

import (
	"testing"

	"github.com/vmchaos/vmchaos/scenarios"
)

// TestNeedsLazyfsOnlyForPowerCutsOrTheFlag: only a run whose cases cut the
// power (or --lazyfs) moves into a private mount namespace.
func TestNeedsLazyfsOnlyForPowerCutsOrTheFlag(t *testing.T) {
	pick := func(id string) []scenarios.Case {
		c, err := scenarios.CaseFor(id, 0, false, "fake")
		if err != nil {
			t.Fatal(err)
		}
		return []scenarios.Case{c}
	}
	cut, plain := pick("powercut-create-agent-create-begin"), pick("s001-3-pending-holder")
	if !needsLazyfs(&runFlags{}, cut) {
		t.Error("a power-cut case does not ask for lazy filesystems")
	}
	if needsLazyfs(&runFlags{}, plain) {
		t.Error("a case without a power cut asks for lazy filesystems")
	}
	if !needsLazyfs(&runFlags{lazyfs: true}, plain) {
		t.Error("--lazyfs does not ask for lazy filesystems")
	}
}
