package powercut_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/lazyfs"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/powercut"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/runner"
	"github.com/vmchaos/vmchaos/stackbin"
)

// TestManagerPowerCutFailsAVmctlWithoutFileFsync runs a manager-verb
// power-cut case (the clone parked at ch.restore.begin, the manager's store
// on lazyfs) through the runner against the manager binary under test: a
// vmctl whose durable writes skip the file fsync (built here, never a
// switch of the product) must fail what a cut must keep (the fixture's VM
// and snapshot, acknowledged before the cut, not listed after it: its
// index is left empty, so the lists fail); the
// real vmctl must pass the same case with both judged.
func TestManagerPowerCutFailsAVmctlWithoutFileFsync(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds a vmctl variant and runs manager cases")
	}
	if why := lazyfs.Available(); why != "" {
		t.Skip("missing host feature: " + why + ": run as root on a host with /dev/fuse (modprobe fuse)")
	}
	real, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	const id = "mgr-clone-powercut-at-ch.restore.begin"
	bad := runMgrCase(t, real, powercut.BuildNoFileFsyncVmctl(t), id)
	lost := invariant(bad, runner.AckedVerbsKept)
	if bad.Verdict != reports.Fail || lost == nil || lost.OK || !strings.Contains(lost.Evidence, "after the cut") {
		t.Fatalf("without file fsync: %s (%s); %s: %+v", bad.Verdict, bad.Reason, runner.AckedVerbsKept, lost)
	}
	t.Logf("without file fsync: %s, %s: %s", bad.Verdict, lost.Name, lost.Evidence)

	good := runMgrCase(t, real, real+"/vmctl", id)
	if good.Verdict != reports.Pass {
		t.Fatalf("real vmctl: %s (%s) %+v", good.Verdict, good.Reason, good.Invariants)
	}
	for _, name := range []string{runner.AckedVerbsKept, "records-have-data-after-cut", runner.BootsAfterCut, runner.RecoveryVerbSucceeds} {
		if inv := invariant(good, name); inv == nil || !inv.OK {
			t.Errorf("real vmctl: %s not judged or violated: %+v", name, inv)
		}
	}
}

// runMgrCase runs manager case id against the vmctl binary mbin.
func runMgrCase(t *testing.T, bins, mbin, id string) reports.Case {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := runner.New(ctx, runner.Options{ReportDir: t.TempDir(), Scale: 0.05, Seed: 1, BinDir: bins,
		Manager: "vmctl", ManagerBin: mbin})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m, err := runner.NewManager("vmctl", manager.Options{Bin: mbin})
	if err != nil {
		t.Fatal(err)
	}
	phases := map[manager.Verb][]string{manager.VerbClone: {"ch.restore.begin"}}
	for _, c := range scenarios.ExpandManager(m, phases, nil) {
		if c.ID == id {
			return r.RunCase(ctx, c)
		}
	}
	t.Fatalf("no case %s", id)
	return reports.Case{}
}
