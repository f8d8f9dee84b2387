package runner

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/internal/needs"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/manager/cocoon"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/stackbin"
)

// The workload case's judgement fails on the bug it targets (issue 32 item
// 2): a manager whose save copies the guest's disk after it resumed the VM
// (a test-only double: a wrapper of the bundled vmctl that, once the save
// of tgt succeeded, copies the source's live disk over the snapshot's) gives
// a clone holding markers the writer began after the save's resume, and
// workload-consistent-cut must fail naming them; the bundled vmctl passes
// the same case.
func TestManagerWorkloadCutFailsOnDiskCopiedAfterResume(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs a manager case with the guest writer against the bundled vmctl; run without -short")
	}
	bin, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	const id = "mgr-snapshot-save-kill-at-ch.snapshot.memory-written-workload"
	late := `case "$*" in
"snapshot save --name tgt"*)
  # the first save is the verb the case kills: vmctl itself (exec'd, so
  # the SIGKILL hits it); the retry is the one that copies late
  n=$(cat $STATE/n 2>/dev/null || echo 0); echo $((n+1)) > $STATE/n
  [ "$n" = 0 ] && exec ` + filepath.Join(bin, "vmctl") + ` "$@"
  ` + filepath.Join(bin, "vmctl") + ` "$@"; rc=$?
  if [ $rc = 0 ]; then
    sleep 0.3 # the writer goes on after the resume; the copy comes later
    meta=$(grep -l '"tgt"' $VMCTL_ROOT_DIR/snapshots/*/vmctl.json | head -1)
    disk=$(ls -t $VMCTL_ROOT_DIR/vms/*/disk.img | head -1)
    cp "$disk" "$(dirname "$meta")/disk.img" || exit 9
  fi
  exit $rc;;
esac`
	for _, tc := range []struct {
		name, mbin string
		ok         bool
		want       string
	}{
		{"vmctl", filepath.Join(bin, "vmctl"), true, "holds the save's cut"},
		{"disk copied after the resume", brokenVmctl(t, bin, late), false, "PHANTOM"},
	} {
		rc := mgrCaseRun(t, bin, tc.mbin, id)
		var got *reports.Invariant
		for i := range rc.Invariants {
			if rc.Invariants[i].Name == WorkloadConsistentCut {
				got = &rc.Invariants[i]
			}
		}
		if got == nil || got.OK != tc.ok || !strings.Contains(got.Evidence, tc.want) {
			t.Fatalf("%s: %s (%s) %+v; want %s ok=%v naming %q", tc.name, rc.Verdict, rc.Reason, got, WorkloadConsistentCut, tc.ok, tc.want)
		}
		if want := map[bool]string{true: reports.Pass, false: reports.Fail}[tc.ok]; rc.Verdict != want {
			t.Fatalf("%s: verdict %s, want %s (%s)", tc.name, rc.Verdict, want, rc.Reason)
		}
		if rc.Workload == nil || len(rc.Workload.Cuts) != 1 || len(rc.Workload.Acks) == 0 {
			t.Fatalf("%s: the report's workload section: %+v", tc.name, rc.Workload)
		}
		t.Logf("%s: %s", tc.name, got.Evidence)
	}
}

// The save's window is the source VMM's last completed pause → resume of
// one pid: a killed save's pause that a `start` resumed is an earlier pair,
// another VM's phases are not the source's, and no pair is no window.
func TestMgrSaveWindow(t *testing.T) {
	ev := func(ts int64, pid int, vm, point string) failpoint.Event {
		return failpoint.Event{TsNs: ts, Pid: pid, VM: vm, Proc: "fakech", Point: point}
	}
	evs := []failpoint.Event{ev(10, 1, "A", "ch.pause"), ev(20, 1, "A", "ch.resume"), ev(30, 1, "A", "ch.pause"),
		ev(35, 2, "B", "ch.pause"), ev(38, 2, "B", "ch.resume"), ev(40, 1, "A", "ch.resume"), ev(50, 1, "A", "ch.pause")}
	w, ok := mgrSaveWindow(evs, "A")
	if !ok || w.PauseNs != 30 || w.ResumeNs != 40 {
		t.Fatalf("window %+v %v, want 30..40", w, ok)
	}
	if _, ok := mgrSaveWindow(evs[:1], "A"); ok {
		t.Fatal("a pause without its resume is no window")
	}
	if _, ok := mgrSaveWindow(evs, "C"); ok {
		t.Fatal("another VM's phases are no window")
	}
}

// A manager run's temp dir leaves its deepest socket under sun_path's 107
// bytes: a long TMPDIR falls back to /tmp (the power-cut cells' serial
// sockets failed EINVAL from their tenth case on under /tmp/mgrwork-tmp).
func TestMgrTmpBaseLeavesRoomForSockets(t *testing.T) {
	if got := mgrTmpBase("/tmp"); got != "/tmp" {
		t.Fatalf("/tmp → %q", got)
	}
	long := "/tmp/mgrwork-tmp"
	if got := mgrTmpBase(long); got != "/tmp" {
		t.Fatalf("%s → %q, want /tmp (deepest socket %d bytes)", long, got, len(long)+mgrSockTail)
	}
	if n := len("/tmp") + mgrSockTail; n > 107 {
		t.Fatalf("even /tmp leaves %d bytes", n)
	}
}

// A repro's runs (case id <id>.runK) print the repro line of the case
// itself: a case: label no filter would match is no repro line.
func TestMgrReproLineOfARepeatedRun(t *testing.T) {
	r := &Runner{opts: Options{Scale: 0.1, Seed: 1}, mgr: &mgrRun{name: "cocoon", bin: "/c"}}
	c := scenarios.Case{ID: "mgr-clone-kill-at-35%.run5", Scenario: &scenarios.Scenario{ID: "mgr-clone-kill-at-35%"}}
	got := r.mgrRepro(c, nil)
	if want := "--label-filter 'case:mgr-clone-kill-at-35pct'"; !strings.HasSuffix(got, want) {
		t.Fatalf("repro line %q, want it to end %q", got, want)
	}
}

// TestCocoonWorkloadWithoutCNIPluginsIsInconclusive: on a host without
// containernetworking-plugins a workload case over cocoon is inconclusive
// with the adapter's preflight reason, results.json's not_run names the
// package, and no verb ran (never a silent --nics 0: the case log dir holds
// no verb's log).
func TestCocoonWorkloadWithoutCNIPluginsIsInconclusive(t *testing.T) {
	bin, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	old := cocoon.NetPluginDir
	t.Cleanup(func() { cocoon.NetPluginDir = old })
	cocoon.NetPluginDir = t.TempDir() // no plugin in it
	fake := filepath.Join(t.TempDir(), "cocoon")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho \"cocoon $* must not run\" >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	report := t.TempDir()
	r, err := New(context.Background(), Options{ReportDir: report, Scale: 0.05, Seed: 1, BinDir: bin, Manager: "cocoon", ManagerBin: fake})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	}()
	const id = "mgr-snapshot-save-kill-at-ch.snapshot.memory-written-workload"
	c := saveCase(t, bin, "ch.snapshot.memory-written", id)
	rc := r.RunCase(context.Background(), *c)
	if rc.Verdict != reports.Inconclusive || rc.Culprit != byPrecondition.String() ||
		!strings.Contains(rc.Reason, guestNetPrefix) || !strings.Contains(rc.Reason, cocoon.CNIPackage) {
		t.Fatalf("%s (%s) %q; want inconclusive, precondition, the guest network's reason naming %s", rc.Verdict, rc.Culprit, rc.Reason, cocoon.CNIPackage)
	}
	nr := r.Results().NotRun
	if len(nr) != 1 || nr[0].Case != id || !strings.Contains(nr[0].Missing, cocoon.CNIPackage) || nr[0].Kind != reports.MissingBinary {
		t.Fatalf("not_run = %+v; want %s missing %s", nr, id, cocoon.CNIPackage)
	}
	if logs, _ := os.ReadDir(filepath.Join(report, "cases", id, "logs")); len(logs) != 0 {
		t.Fatalf("verbs ran without a guest network: %v", logs)
	}
}

// lateCopyCocoon writes a test-only double of cocoon: the real binary,
// except that its retried save of tgt (the first one is the verb the case
// kills: cocoon itself, exec'd) copies the source's live disk
// (<run>/cloudhypervisor/<ID>/overlay.qcow2) over the snapshot's 300 ms
// after the save resumed the VM, as a manager that copies the disk outside
// the pause would.
func lateCopyCocoon(t *testing.T, cbin string) string {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "cocoon")
	script := `#!/bin/sh
case "$*" in
"snapshot save --name tgt"*)
  key=$(echo "$COCOON_ROOT_DIR" | md5sum | cut -c1-8)
  n=$(cat ` + dir + `/n-$key 2>/dev/null || echo 0); echo $((n+1)) > ` + dir + `/n-$key
  [ "$n" = 0 ] && exec '` + cbin + `' "$@"
  '` + cbin + `' "$@"; rc=$?
  if [ $rc = 0 ]; then
    sleep 0.3
    snap=$(ls -td $COCOON_ROOT_DIR/snapshot/localfile/*/ | head -1)
    for d in $COCOON_RUN_DIR/cloudhypervisor/*/; do
      [ -f "$d/overlay.qcow2" ] && cp "$d/overlay.qcow2" "$snap/overlay.qcow2"
    done
  fi
  exit $rc;;
esac
exec '` + cbin + `' "$@"
`
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCocoonWorkloadCutFailsOnDiskCopiedAfterResume: the workload cell runs
// over a real cocoon (VMCHAOS_COCOON) with the guest on a real CNI NIC in
// the case's own namespaces, and its judgement fails on the bug it targets
// there too: the real cocoon's clone holds the save's cut; the double whose
// retried save copies the disk after the resume fails
// workload-consistent-cut with PHANTOM markers.
func TestCocoonWorkloadCutFailsOnDiskCopiedAfterResume(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs a manager case with the guest writer against a real cocoon; run without -short")
	}
	cbin := needs.Binary(t, EnvCocoon, "cocoon",
		"build cocoon beside the project (go build in a checkout of github.com/cocoonstack/cocoon) and export "+EnvCocoon+"=/path/to/cocoon, or put it on PATH")
	if why, _ := cocoon.NetPreflight(cocoon.NetPluginDir); why != "" {
		t.Skip("no guest network on this host: " + why)
	}
	bin, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	const id = "mgr-snapshot-save-kill-at-ch.resume-workload"
	c := saveCase(t, bin, "ch.resume", id)
	for _, tc := range []struct {
		name, mbin string
		ok         bool
		want       string
	}{
		{"cocoon", cbin, true, "holds the save's cut"},
		{"disk copied after the resume", lateCopyCocoon(t, cbin), false, "PHANTOM"},
	} {
		r, err := New(context.Background(), Options{ReportDir: t.TempDir(), Scale: 0.1, Seed: 1, BinDir: bin, Manager: "cocoon", ManagerBin: tc.mbin})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		rc := r.RunCase(ctx, *c)
		cancel()
		if err := r.Close(); err != nil {
			t.Error(err)
		}
		var got *reports.Invariant
		for i := range rc.Invariants {
			if rc.Invariants[i].Name == WorkloadConsistentCut {
				got = &rc.Invariants[i]
			}
		}
		if got == nil || got.OK != tc.ok || !strings.Contains(got.Evidence, tc.want) {
			t.Fatalf("%s: %s (%s) %+v; want %s ok=%v naming %q", tc.name, rc.Verdict, rc.Reason, got, WorkloadConsistentCut, tc.ok, tc.want)
		}
		t.Logf("%s: %s", tc.name, got.Evidence)
	}
}

// saveCase is the manager-verb case id among the snapshot-save cases at
// the VMM phase point, generated over the vmctl in bin (the case's shape
// does not depend on the manager it later runs against).
func saveCase(t *testing.T, bin, point, id string) *scenarios.Case {
	t.Helper()
	vm, err := NewManager("vmctl", manager.Options{Bin: filepath.Join(bin, "vmctl")})
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range scenarios.ExpandManager(vm, map[manager.Verb][]string{manager.VerbSnapshotSave: {point}}, nil) {
		if x.ID == id {
			return &x
		}
	}
	t.Fatalf("no case %s", id)
	return nil
}
