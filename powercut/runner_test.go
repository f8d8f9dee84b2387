package powercut_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/lazyfs"
	"github.com/vmchaos/vmchaos/powercut"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/runner"
	"github.com/vmchaos/vmchaos/stackbin"
)

// TestRunnerPowerCutFailsAVmctlWithoutFileFsync runs a catalogue power-cut
// case through the runner (the builtin supervisor, the stack on lazyfs, the
// cut parked right after vmctl renamed a new index into place): with a
// vmctl whose durable writes skip the file fsync (built here, never a
// switch of the product) the case must fail and name the durability
// invariant; with the real vmctl the same case must pass.
func TestRunnerPowerCutFailsAVmctlWithoutFileFsync(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds a vmctl variant and runs the whole stack")
	}
	if why := lazyfs.Available(); why != "" {
		t.Skip("missing host feature: " + why + ": run as root on a host with /dev/fuse (modprobe fuse)")
	}
	real, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	variant := binsWith(t, real, map[string]string{"vmctl": powercut.BuildNoFileFsyncVmctl(t)})
	c, err := scenarios.CaseFor("powercut-create-store-commit-after-rename", 0, false, "fake")
	if err != nil {
		t.Fatal(err)
	}
	bad := runCase(t, variant, c)
	lost := invariant(bad, "records-have-data-after-cut")
	if bad.Verdict != reports.Fail || lost == nil || lost.OK || !strings.Contains(lost.Evidence, "empty") {
		t.Fatalf("without file fsync: %s (%s); records-have-data-after-cut: %+v", bad.Verdict, bad.Reason, lost)
	}
	t.Logf("without file fsync: %s, %s: %s", bad.Verdict, lost.Name, lost.Evidence)

	good := runCase(t, real, c)
	if good.Verdict != reports.Pass || good.LandedPhase != "store.commit.after-rename" {
		t.Fatalf("real vmctl: %s (%s), landed %q", good.Verdict, good.Reason, good.LandedPhase)
	}
	for _, name := range []string{"records-have-data-after-cut", "acked-intents-kept", "records-have-data"} {
		if inv := invariant(good, name); inv == nil || !inv.OK {
			t.Errorf("real vmctl: %s not judged or violated: %+v", name, inv)
		}
	}
}

func invariant(rc reports.Case, name string) *reports.Invariant {
	for i := range rc.Invariants {
		if rc.Invariants[i].Name == name {
			return &rc.Invariants[i]
		}
	}
	return nil
}

// TestRunnerPowerCutLosesTheMarkersOfAGuestWithoutDiskFsync: a fake VMM
// whose guest `sync` writes the disk image without fsyncing it (built
// here) loses, in a power cut of a node at rest, the ledger marker the
// guest acknowledged as synced: ledger-clean names it LOST. The real
// fakech keeps it.
func TestRunnerPowerCutLosesTheMarkersOfAGuestWithoutDiskFsync(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds a fakech variant and runs the whole stack")
	}
	if why := lazyfs.Available(); why != "" {
		t.Skip("missing host feature: " + why + ": run as root on a host with /dev/fuse (modprobe fuse)")
	}
	real, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	fk := powercut.BuildNoDiskFsyncFakech(t)
	variant := binsWith(t, real, map[string]string{"fakech": fk, "cloud-hypervisor": fk})
	c, err := scenarios.CaseFor("powercut-steady", 0, false, "fake")
	if err != nil {
		t.Fatal(err)
	}
	bad := runCase(t, variant, c)
	lost := invariant(bad, "ledger-clean")
	if bad.Verdict != reports.Fail || lost == nil || lost.OK || !strings.Contains(lost.Evidence, "LOST") {
		t.Fatalf("fakech without disk fsync: %s (%s); ledger-clean: %+v", bad.Verdict, bad.Reason, lost)
	}
	t.Logf("fakech without disk fsync: %s, %s: %s", bad.Verdict, lost.Name, lost.Evidence)
	good := runCase(t, real, c)
	if inv := invariant(good, "ledger-clean"); good.Verdict != reports.Pass || inv == nil || !inv.OK {
		t.Fatalf("real fakech: %s (%s); ledger-clean: %+v", good.Verdict, good.Reason, inv)
	}
}

// binsWith is a bin dir of the stack binaries of real, with some replaced.
func binsWith(t *testing.T, real string, replace map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range stackbin.Names {
		src := filepath.Join(real, n)
		if r, ok := replace[n]; ok {
			src = r
		}
		if err := os.Symlink(src, filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// runCase runs one case on a fresh runner (builtin supervisor) over bins.
func runCase(t *testing.T, bins string, c scenarios.Case) reports.Case {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	r, err := runner.New(ctx, runner.Options{ReportDir: t.TempDir(), Supervisor: "builtin", Scale: 0.05, Seed: 1, BinDir: bins})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	return r.RunCase(ctx, c)
}
