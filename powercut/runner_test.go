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
		t.Skip(why)
	}
	real, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	variant := t.TempDir()
	for _, n := range stackbin.Names {
		if err := os.Symlink(filepath.Join(real, n), filepath.Join(variant, n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(variant, "vmctl")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(powercut.BuildNoFileFsyncVmctl(t), filepath.Join(variant, "vmctl")); err != nil {
		t.Fatal(err)
	}
	c, err := scenarios.CaseFor("powercut-create-store-commit-after-rename", 0, false, "fake")
	if err != nil {
		t.Fatal(err)
	}
	run := func(bins string) reports.Case {
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

	bad := run(variant)
	lost := invariant(bad, "records-have-data-after-cut")
	if bad.Verdict != reports.Fail || lost == nil || lost.OK || !strings.Contains(lost.Evidence, "empty") {
		t.Fatalf("without file fsync: %s (%s); records-have-data-after-cut: %+v", bad.Verdict, bad.Reason, lost)
	}
	t.Logf("without file fsync: %s, %s: %s", bad.Verdict, lost.Name, lost.Evidence)

	good := run(real)
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
