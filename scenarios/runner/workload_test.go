package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/stackbin"
)

// lateDiskVmctl is a test double of the manager, written by the test into
// its own bin dir and never shipped: a vmctl whose `snapshot save` copies
// the VM's disk into the finished snapshot once more after the save resumed
// the guest — a manager that copies the disk outside the pause window.
const lateDiskVmctl = `#!/bin/sh
real=%REAL%/vmctl
if [ "$1" = snapshot ] && [ "$2" = save ]; then
	"$real" "$@" || exit $?
	for a in "$@"; do id="$a"; done
	sleep 0.1 # the guest writes on after the resume
	snap=$(ls -td "$VMCTL_ROOT_DIR"/snapshots/*/ | head -1)
	cp "$VMCTL_ROOT_DIR/vms/$id/disk.img" "$snap/disk.img.late" && mv "$snap/disk.img.late" "$snap/disk.img"
	exit 0
fi
exec "$real" "$@"
`

// doubleBinDir is the stack's bin dir with vmctl replaced by the late-disk
// double.
func doubleBinDir(t *testing.T) string { return doubleBinDirWith(t, lateDiskVmctl) }

// doubleBinDirWith is the stack's bin dir with vmctl replaced by script
// (%REAL% the real bin dir).
func doubleBinDirWith(t *testing.T, script string) string {
	t.Helper()
	real, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ents, err := os.ReadDir(real)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == "vmctl" {
			continue
		}
		if err := os.Symlink(filepath.Join(real, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	script = strings.ReplaceAll(script, "%REAL%", real)
	if err := os.WriteFile(filepath.Join(dir, "vmctl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// staleDiskVmctl is a test double of the manager, written by the test and
// never shipped: a vmctl that keeps a copy of the VM's disk from when the
// hibernate's NIC drop began (the guest writes and acks on until the NIC is
// gone) and makes it the disk of every snapshot it saves afterwards — a
// manager whose save snapshots a stale disk. The cut of the save that
// follows a killed one loses the markers acked after that copy.
const staleDiskVmctl = `#!/bin/sh
real=%REAL%/vmctl
if [ "$1" = vm ] && [ "$2" = net ] && [ "$4" = --nics ] && [ "$5" = 0 ]; then
	cp "$VMCTL_ROOT_DIR/vms/$3/disk.img" "%STATE%/stale-$3.img"
	sleep 0.2 # the guest writes on until the NIC is gone
	exec "$real" "$@"
fi
if [ "$1" = snapshot ] && [ "$2" = save ]; then
	"$real" "$@" || exit $?
	for a in "$@"; do id="$a"; done
	if [ -f "%STATE%/stale-$id.img" ]; then
		snap=$(ls -td "$VMCTL_ROOT_DIR"/snapshots/*/ | head -1)
		cp "%STATE%/stale-$id.img" "$snap/disk.img.stale" && mv "$snap/disk.img.stale" "$snap/disk.img"
	fi
	exit 0
fi
exec "$real" "$@"
`

// TestKilledSaveWithAStaleDiskFailsTheCut is the proof that a killed-save
// case judges the cut of the save that follows: the same case passes with
// vmctl and fails on workload-consistent-cut (LOST) with a vmctl double
// whose recovered save snapshots a stale disk.
func TestKilledSaveWithAStaleDiskFailsTheCut(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts the whole stack; run without -short")
	}
	c, err := scenarios.CaseFor("wl-save-killed-paused-sigkill-child", 0, false, "fake")
	if err != nil {
		t.Fatal(err)
	}
	good := runOneCase(t, c)
	inv, ok := cutInvariant(good)
	if good.Verdict != reports.Pass || !ok || !inv.OK || good.Workload == nil || len(good.Workload.Cuts) != 1 {
		t.Fatalf("with vmctl: %s (%s), cut invariant %+v", good.Verdict, good.Reason, inv)
	}
	t.Logf("vmctl: %s; %s", inv.Evidence, good.Workload.Cuts[0].Message)

	old := binDir
	t.Cleanup(func() { binDir = old })
	dir := doubleBinDirWith(t, strings.ReplaceAll(staleDiskVmctl, "%STATE%", t.TempDir()))
	binDir = func() (string, error) { return dir, nil }
	bad := runOneCase(t, c)
	wantOnlyCutFailed(t, bad, "LOST", "stale-disk")
}

func cutInvariant(rc reports.Case) (reports.Invariant, bool) {
	for _, inv := range rc.Invariants {
		if inv.Name == WorkloadConsistentCut {
			return inv, true
		}
	}
	return reports.Invariant{}, false
}

// TestInconsistentSaveFailsTheCase is the end-to-end proof of issue #13: the
// same case passes with vmctl and fails on workload-consistent-cut with
// PHANTOM markers when the manager copies the disk after the resume.
func TestInconsistentSaveFailsTheCase(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts the whole stack; run without -short")
	}
	c, err := scenarios.CaseFor("wl-save-held-captured", 0, false, "fake")
	if err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T) reports.Case { return runOneCase(t, c) }
	good := run(t)
	inv, ok := cutInvariant(good)
	if good.Verdict != reports.Pass || !ok || !inv.OK || good.Workload == nil || len(good.Workload.Cuts) != 1 {
		t.Fatalf("with vmctl: %s (%s), cut invariant %+v", good.Verdict, good.Reason, inv)
	}
	t.Logf("vmctl: %s; %s", inv.Evidence, good.Workload.Cuts[0].Message)

	old := binDir
	t.Cleanup(func() { binDir = old })
	dir := doubleBinDir(t)
	binDir = func() (string, error) { return dir, nil }
	bad := run(t)
	wantOnlyCutFailed(t, bad, "PHANTOM", "late-disk")
}

// runOneCase runs c on a fresh fake stack and checks teardown left no
// process.
func runOneCase(t *testing.T, c scenarios.Case) reports.Case {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, err := New(ctx, Options{ReportDir: t.TempDir(), Supervisor: "builtin", Scale: 0.05, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rc := r.RunCase(ctx, c)
	if left := leftovers(r); len(left) > 0 {
		t.Fatalf("processes left: %v", left)
	}
	return rc
}

func TestSaveWindowPairsOneProcess(t *testing.T) {
	ev := func(ts int64, pid int, point, vm string) failpoint.Event {
		return failpoint.Event{TsNs: ts, Pid: pid, Proc: "vmctl", Point: point, VM: vm}
	}
	// the direct save (pid 10) dies while paused; the agent's later save
	// (pid 20) of the same VM must not lend it a resume
	events := []failpoint.Event{ev(5, 10, "snapshot.save.paused", "id1"), ev(50, 20, "snapshot.save.paused", "id1"),
		ev(60, 20, "snapshot.save.resumed", "id1")}
	if w, ok := saveWindow(events, "id1", 1); ok {
		t.Fatalf("a killed save got a window %+v", w)
	}
	events = append(events[:1], ev(7, 30, "snapshot.save.resumed", "id2"), ev(9, 10, "snapshot.save.resumed", "id1"))
	if w, ok := saveWindow(events, "id1", 1); !ok || w.PauseNs != 5 || w.ResumeNs != 9 {
		t.Fatalf("window %+v %v", w, ok)
	}
	if _, ok := saveWindow(events, "id1", 6); ok {
		t.Fatal("a save begun before fromNs was taken")
	}
}

func TestDownsampleKeepsTheAcksNextToMarks(t *testing.T) {
	var acks []reports.WorkloadAckPoint
	for i := 1; i <= 1000; i++ {
		acks = append(acks, reports.WorkloadAckPoint{Guest: "g", Seq: i, AckNs: int64(i) * 10})
	}
	marks := []reports.WorkloadMark{{TsNs: 5005, Kind: "pause"}, {TsNs: 5995, Kind: "resume"}}
	out := downsample(acks, marks, 150)
	if len(out) > 160 || len(out) < 140 {
		t.Fatalf("%d acks kept", len(out))
	}
	seqs := map[int]bool{}
	for _, a := range out {
		seqs[a.Seq] = true
	}
	for _, s := range []int{1, 500, 501, 599, 600, 1000} {
		if !seqs[s] {
			t.Errorf("seq %d (next to a mark or an end) dropped", s)
		}
	}
	if got := downsample(acks[:10], marks, 150); len(got) != 10 {
		t.Fatal("a short list was thinned")
	}
}

// TestACutTheJournalCouldNotJudgeIsTheHarnesss: workload-consistent-cut
// fails when a cut could not be judged; when the only reason is the
// harness's own journal (ledger.ErrJournal) it is a harness error, and
// beside an inconsistent cut it stays the product's fail.
// TestCutInvariantRules is one row per rule of workload-consistent-cut
// (issue 31 item 4): what fails, what is the harness's error, what passes.
func TestCutInvariantRules(t *testing.T) {
	unread := fmt.Errorf("vm-a wake: %w: read /x/ledger.jsonl: no such file", ledger.ErrJournal)
	good := ledger.CutVerdict{Snapshot: "hibernate", OK: true, Judged: 40}
	bad := ledger.CutVerdict{Snapshot: "hibernate", Message: "vm-a → vm-a (hibernate): LOST 3: seq 41"}
	refused := fmt.Errorf("ledger vm-a: workload: unreachable after 3 attempt(s): context deadline exceeded (last error: %w)",
		fmt.Errorf("guest vm-a at 127.0.0.1:2222: ssh handshake: %w: ssh: unable to authenticate", ledger.ErrHarnessSSH))
	down := errors.New("ledger vm-a: workload: unreachable after 9 attempt(s): context deadline exceeded (last error: guest vm-a: connect: connection refused)")
	for _, tc := range []struct {
		name        string
		f           cutFindings
		ok, harness bool
		want        string
	}{
		{name: "writer never started (guest unreachable)", f: cutFindings{cuts: []ledger.CutVerdict{good},
			starts: []writerFailure{{guest: "vm-a", err: down, harness: harnessSideWriterError(down)}}}, want: "the writer did not start"},
		{name: "writer not started: the harness's own ssh failed", f: cutFindings{
			starts: []writerFailure{{guest: "vm-a", err: refused, harness: harnessSideWriterError(refused)}}}, harness: true, want: "unable to authenticate"},
		{name: "no cut judged", f: cutFindings{}, want: "nothing was judged"},
		{name: "only a killed save, nothing judged", f: cutFindings{killed: []string{"save of vm-a killed by the fault (sigkill-direct)"}}, want: "nothing was judged"},
		{name: "a save that did not complete, no fault killed it", f: cutFindings{cuts: []ledger.CutVerdict{good},
			errs: []error{errors.New("save of vm-a: no paused→resumed pair in the trace and no fault of the case kills a save: the save did not complete")}}, want: "did not complete"},
		{name: "consistent cut", f: cutFindings{cuts: []ledger.CutVerdict{good}}, ok: true, want: "1 cut(s) consistent, 40 marker(s) judged"},
		{name: "consistent cut beside a killed save", f: cutFindings{cuts: []ledger.CutVerdict{good}, killed: []string{"save of vm-a killed by the fault"}},
			ok: true, want: "killed by the fault"},
		{name: "inconsistent cut", f: cutFindings{cuts: []ledger.CutVerdict{good, bad}}, want: "LOST 3"},
		{name: "journal unreadable", f: cutFindings{errs: []error{unread}}, harness: true, want: "ledger journal unreadable"},
		{name: "journal unreadable beside a bad cut", f: cutFindings{cuts: []ledger.CutVerdict{bad}, errs: []error{unread}}, want: "LOST"},
		{name: "guest unreachable at the judgement", f: cutFindings{errs: []error{errors.New("vm-a wake: ssh: connection refused")}}, want: "connection refused"},
		{name: "the VM ends deleted: no cut can exist", f: cutFindings{noCut: []string{"vm-a ends deleted: no guest is left to hold a cut"}},
			ok: true, want: "no cut can exist: vm-a ends deleted"},
		{name: "a deleted VM excuses nothing else", f: cutFindings{noCut: []string{"vm-b ends deleted"}, errs: []error{down}}, want: "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cr := &caseRun{s: &scenarios.Scenario{Expect: scenarios.Expect{Workload: true}}}
			inv := cr.cutInvariant(tc.f)
			if inv.OK != tc.ok || inv.HarnessError != tc.harness || !strings.Contains(inv.Evidence, tc.want) {
				t.Fatalf("got ok=%v harness=%v %q, want ok=%v harness=%v containing %q", inv.OK, inv.HarnessError, inv.Evidence, tc.ok, tc.harness, tc.want)
			}
			if !inv.OK && inv.Evidence == "" {
				t.Fatal("a failed cut without evidence")
			}
		})
	}
}

// TestACompulsoryCutThatDidNotConvergeFails: a case that must judge the cut
// and did not converge has nothing to judge, which never passes.
func TestACompulsoryCutThatDidNotConvergeFails(t *testing.T) {
	cr := &caseRun{s: &scenarios.Scenario{}}
	cr.wl().startFailed("vm-a", errors.New("connect: connection refused"), false)
	inv := cr.cutNotJudged()
	if inv.OK || inv.HarnessError || !strings.Contains(inv.Evidence, "did not converge") || !strings.Contains(inv.Evidence, "vm-a: the writer did not start") {
		t.Fatalf("%+v", inv)
	}
}

// TestWriterStartFailuresAreToldApart: the harness's own side (its key
// refused, its journal, an image without the writer) is an error; the guest
// not answering, another host key or the writer failing is the product's.
func TestWriterStartFailuresAreToldApart(t *testing.T) {
	for _, tc := range []struct {
		err     error
		harness bool
	}{
		{fmt.Errorf("unreachable after 2 attempt(s): deadline (last error: %w)", fmt.Errorf("ssh handshake: %w: unable to authenticate", ledger.ErrHarnessSSH)), true},
		{fmt.Errorf("ledger vm-a: workload: %w: %w", ledger.ErrHarnessSSH, errors.New("ledger journal: disk full")), true},
		{fmt.Errorf("judge: %w", ledger.ErrJournal), true},
		{&ledger.CommandError{Guest: "vm-a", Status: 127, Stderr: "vmchaos-writer: not found"}, true},
		{&ledger.CommandError{Guest: "vm-a", Status: 1, Stderr: "read-only file system"}, false},
		{fmt.Errorf("ledger vm-a: workload: %w", ledger.ErrHostKeyChanged), false},
		{errors.New("guest vm-a: connect: connection refused"), false},
	} {
		if got := harnessSideWriterError(tc.err); got != tc.harness {
			t.Errorf("%v: harness=%v, want %v", tc.err, got, tc.harness)
		}
	}
}

// TestKilledSavesAndColdBootsComeFromTheCase: a save may end without a
// resume only when the case's fault kills saves; a guest may lose its RAM
// only when the case kills its VMM.
func TestKilledSavesAndColdBootsComeFromTheCase(t *testing.T) {
	for _, tc := range []struct {
		id           string
		killer, cold bool
	}{
		{"s001-2-orphaned-pause-then-hibernate", true, false}, // sigkill-direct in the pause window
		{"wl-save-held-paused", false, false},
		{"wl-save-killed-paused-power-cut", true, false}, // the power cut's cold boot comes from the cut itself
		{"mx-hibernate-agent-hibernate-saved-sigkill-vmm", true, true},
		{"s001-4-owed-hibernate-dead-vmm", false, true}, // kill-vmm while stopped
		{"park-snapshot-save-paused-sigkill-main", false, false},
		{"cov-hibernate-ch-eject-acked-failpoint-kill", false, true}, // the VMM kills itself at the point
		{"cov-save-ch-pause-failpoint-exit", false, true},
		{"cov-save-ch-pause-failpoint-error", false, false}, // the VMM answers an error and lives on
		{"cov-create-agent-create-begin-failpoint-kill", false, false},
	} {
		s, ok := scenarios.Lookup(tc.id)
		if !ok {
			t.Fatalf("no scenario %s", tc.id)
		}
		if got := savesKilledBy(s) != ""; got != tc.killer {
			t.Errorf("%s: a fault kills saves = %v, want %v", tc.id, got, tc.killer)
		}
		if got := vmmKilledReason(s) != ""; got != tc.cold {
			t.Errorf("%s: VMM killed = %v, want %v", tc.id, got, tc.cold)
		}
	}
}

// TestNICDropFromVmctlWhenTheAgentDiedBeforeItsPoint: the agent SIGKILLed
// after vmctl removed the NIC and before it wrote agent.hibernate.nic-dropped
// resumes at the save and never writes it (sweep-hibernate-sigkill@40% in a
// bench run); the drop is then vmctl's vm.net.removed of the writer's VM
// before the hibernate's save, never one after it (the wake's).
func TestNICDropFromVmctlWhenTheAgentDiedBeforeItsPoint(t *testing.T) {
	vms := map[string]string{"VM1": "vm-a"}
	ev := func(ns int64, point, vm string) failpoint.Event {
		return failpoint.Event{TsNs: ns, Point: point, VM: vm}
	}
	for _, tc := range []struct {
		name   string
		events []failpoint.Event
		want   int64
	}{
		{"the agent's point", []failpoint.Event{ev(10, "vm.net.removed", "VM1"), ev(12, "agent.hibernate.nic-dropped", "vm-a"), ev(20, "agent.hibernate.saved", "vm-a")}, 12},
		{"vmctl's removal", []failpoint.Event{ev(10, "vm.net.removed", "VM1"), ev(20, "agent.hibernate.saved", "vm-a"), ev(30, "vm.net.removed", "VM1")}, 10},
		{"another VM's removal", []failpoint.Event{ev(10, "vm.net.removed", "VM2"), ev(20, "agent.hibernate.saved", "vm-a")}, 0},
		{"none", []failpoint.Event{ev(20, "agent.hibernate.saved", "vm-a")}, 0},
	} {
		if got := nicDropNs(tc.events, "vm-a", vms); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// wantOnlyCutFailed: with a double, the case fails on the cut alone, and
// its evidence names want (LOST, PHANTOM).
func wantOnlyCutFailed(t *testing.T, bad reports.Case, want, double string) {
	t.Helper()
	inv, ok := cutInvariant(bad)
	if bad.Verdict != reports.Fail || !ok || inv.OK || !strings.Contains(inv.Evidence, want) {
		t.Fatalf("with the %s double: %s (%s), cut invariant %+v", double, bad.Verdict, bad.Reason, inv)
	}
	for _, i := range bad.Invariants {
		if !i.OK && i.Name != WorkloadConsistentCut {
			t.Errorf("the double broke %s too: %s", i.Name, i.Evidence)
		}
	}
	t.Logf("%s double: %s", double, inv.Evidence)
}

// TestHibernateSaveWindowOverCocoon: the agent over cocoon saves with the
// NIC up, so a wake is judged against the hibernate's own save: fakech's
// ch.pause and that VMM's next ch.resume on the writer's VM, the last pair
// before agent.hibernate.saved (a retried save's earlier pair and the
// wake's clone resume after it are not it).
func TestHibernateSaveWindowOverCocoon(t *testing.T) {
	vms := map[string]string{"VM1": "vm-a", "VM2": "vm-a"}
	ev := func(ns int64, point, vm string, pid int) failpoint.Event {
		return failpoint.Event{TsNs: ns, Point: point, VM: vm, Pid: pid}
	}
	for _, tc := range []struct {
		name          string
		events        []failpoint.Event
		pause, resume int64
	}{
		{"one save", []failpoint.Event{ev(5, "ch.resume", "VM1", 7), ev(10, "ch.pause", "VM1", 7), ev(12, "ch.resume", "VM1", 7),
			ev(20, "agent.hibernate.saved", "vm-a", 1), ev(30, "ch.resume", "VM2", 8)}, 10, 12},
		{"a retried save", []failpoint.Event{ev(10, "ch.pause", "VM1", 7), ev(12, "ch.resume", "VM1", 7), ev(14, "ch.pause", "VM1", 7),
			ev(16, "ch.resume", "VM1", 7), ev(20, "agent.hibernate.saved", "vm-a", 1)}, 14, 16},
		{"paused, never resumed", []failpoint.Event{ev(10, "ch.pause", "VM1", 7), ev(20, "agent.hibernate.saved", "vm-a", 1)}, 0, 0},
		{"another guest's VM", []failpoint.Event{ev(10, "ch.pause", "VM9", 7), ev(12, "ch.resume", "VM9", 7), ev(20, "agent.hibernate.saved", "vm-a", 1)}, 0, 0},
	} {
		if p, r := hibernateSaveWindow(tc.events, "vm-a", vms); p != tc.pause || r != tc.resume {
			t.Errorf("%s: pause %d resume %d, want %d %d", tc.name, p, r, tc.pause, tc.resume)
		}
	}
}

// TestAckedAfterTheSaveResumedIsLost: over a manager without a NIC verb the
// hibernate saves with the NIC up; a marker the guest acked after the save
// resumed the VM is in no snapshot, so the wake's verdict must fail on it
// (it once went to a note and the case passed).
func TestAckedAfterTheSaveResumedIsLost(t *testing.T) {
	acks := []ledger.WorkloadAck{{Seq: 1, AckNs: 5, HostNs: 5}, {Seq: 2, AckNs: 15, HostNs: 15}, {Seq: 3, AckNs: 25, HostNs: 25}}
	lost := ackedAfter(acks, 12, 20, true)
	if len(lost) != 1 || lost[0].Seq != 2 {
		t.Fatalf("acked in (12, 20): %+v, want seq 2 alone", lost)
	}
	if n := len(ackedAfter(acks, 12, 0, true)); n != 2 {
		t.Fatalf("no end: %d acks after 12, want 2", n)
	}
	v := ledger.CutVerdict{OK: true}.WithLost(lost)
	if v.OK || len(v.Lost) != 1 || !strings.Contains(v.Message, "seq 2") {
		t.Fatalf("a verdict with an ack past the snapshot: %+v, want a fail naming seq 2", v)
	}
	if w := (ledger.CutVerdict{OK: true}).WithLost(nil); !w.OK {
		t.Fatal("nothing lost must leave the verdict as it was")
	}
}
