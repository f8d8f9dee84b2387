package runner

import (
	"context"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// TestPowerCutCaseIsInconclusiveWithoutFUSE: where no lazy filesystem can
// mount, a power-cut case proves nothing about the product: inconclusive,
// with the host's reason, and no stack is built for it.
func TestPowerCutCaseIsInconclusiveWithoutFUSE(t *testing.T) {
	const why = "FUSE unavailable: open /dev/fuse: no such file or directory"
	old := fuseAvailable
	fuseAvailable = func() string { return why }
	t.Cleanup(func() { fuseAvailable = old })

	c, err := scenarios.CaseFor("powercut-create-agent-create-begin", 0, false, "fake")
	if err != nil {
		t.Fatal(err)
	}
	// no shared stack (r.run nil): building one would panic, so the
	// verdict must come before any stack is built
	r := &Runner{opts: Options{ReportDir: t.TempDir(), Scale: 0.05, Backend: "fake", Supervisor: "builtin", StablePolls: 3},
		res: &reports.Results{}}
	rc := r.RunCase(context.Background(), c)
	if rc.Verdict != reports.Inconclusive || !strings.Contains(rc.Reason, why) {
		t.Fatalf("without FUSE: %s (%s), want inconclusive naming %q", rc.Verdict, rc.Reason, why)
	}

	plain, err := scenarios.CaseFor("s001-3-pending-holder", 0, false, "fake")
	if err != nil {
		t.Fatal(err)
	}
	if lazy, reason := lazyStack(plain.Scenario, false); lazy != nil || reason != "" {
		t.Errorf("a case without a power cut asks for lazy filesystems: %v %q", lazy != nil, reason)
	}
}
