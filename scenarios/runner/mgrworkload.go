package runner

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// The live workload in a manager-verb case (issue 32 item 2): the fixture's
// VM gets a NIC, its guest runs the ledger's writer (the agent catalogue's,
// ledger.StartWorkload) from before the verb under test until after the
// embedder's recovery, and the snapshot the save and its retry leave is
// cloned with a NIC: the clone must hold exactly the cut of the save that
// made it — every marker acked before that save's pause, none begun after
// its resume, no holes — and the source must have gone on writing past it.
// The window is read from the VMM's own phases (fakech's ch.pause and
// ch.resume of the source's VMM), so it needs nothing of the manager but
// its verbs: the same judgement on every adapter that gives a guest a NIC
// (manager.GuestNet).

// guestNetPrefix starts the reason of a workload case the host cannot give
// a reachable guest (notrun.go names what is missing from it).
const guestNetPrefix = "guest network: "

// mgrCutClone is the VM the judgement clones from the saved snapshot.
const mgrCutClone = "tgt-cut"

// mgrWorkload is the writer state of one manager case.
type mgrWorkload struct {
	led      *ledger.Ledger
	session  *ledger.Workload
	stats    ledger.WorkloadStats
	stopped  bool
	startErr error
	cut      *ledger.CutVerdict
}

// mgrNetPool is the case's own loopback /24 for its guests' addresses: the
// case's number in the run, in a /16 picked from the run's temp dir, away
// from the stacks' 127.200–249 (stack.Run.netPool), so concurrent cases and
// runs do not bind one address twice.
func mgrNetPool(runTmp, caseDir string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(runTmp))
	n, _ := strconv.Atoi(strings.TrimLeft(filepath.Base(caseDir), "abcdefghijklmnopqrstuvwxyz"))
	return fmt.Sprintf("127.%d.%d.0/24", 150+h.Sum32()%40, n%256)
}

// oneNIC is the NIC count of the VMs a workload case reaches the guest of.
func oneNIC() *int { n := 1; return &n }

// startWorkload opens the case's ledger and starts the writer in src's
// guest, then waits for its first acks (the cut needs markers acked before
// the pause). A writer that does not start fails workload-consistent-cut
// later with the error; a harness-side failure (its key, its journal) is a
// harness error now.
func (mc *mgrCase) startWorkload(ctx context.Context) error {
	led, err := ledger.Open(filepath.Join(mc.caseDir, "ledger.jsonl"), mc.r.mgr.key, filepath.Join(mc.caseDir, "known_hosts"))
	if err != nil {
		return harnessErr(fmt.Errorf("the case's ledger: %w", err))
	}
	if d, ok := mc.m.(manager.GuestDialer); ok {
		led.Dial = d.DialGuest // cocoon: each guest inside its VM's netns
	}
	mc.wl = &mgrWorkload{led: led}
	g, err := mc.guestOf(ctx, scenarios.MgrSrcVM)
	if err != nil {
		mc.wl.startErr = err
		return nil
	}
	s, err := led.StartWorkload(ctx, g, ledger.WorkloadOpts{})
	if err != nil {
		if harnessSideWriterError(err) {
			return harnessErr(fmt.Errorf("start the writer in %s: %w", g.Name, err))
		}
		mc.wl.startErr = err
		return nil
	}
	mc.wl.session = s
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a safety net: the writer acks every few ms
	defer cancel()
	if err := s.WaitAcks(wctx, 20); err != nil {
		mc.wl.startErr = err
	}
	return nil
}

// guestOf is the guest of the VM called name, at the address the
// manager's list records.
func (mc *mgrCase) guestOf(ctx context.Context, name string) (ledger.Guest, error) {
	vms, err := mc.m.VMs(ctx)
	if err != nil {
		return ledger.Guest{}, fmt.Errorf("vm list for %s's address: %w", name, err)
	}
	for _, v := range vms {
		if v.Name == name {
			if v.Address == "" {
				return ledger.Guest{}, fmt.Errorf("vm %s (%s) is listed without a guest address", name, v.ID)
			}
			return ledger.Guest{Name: name, Addr: v.Address}, nil
		}
	}
	return ledger.Guest{}, fmt.Errorf("vm %s is not listed", name)
}

// stopWorkload lets the source go on past the recovery's save (more acks,
// the proof it went on), then ends the session. A source that stays paused
// (a manager that left its VMM Paused) acks nothing more: the judgement
// says so.
func (mc *mgrCase) stopWorkload(ctx context.Context) {
	w := mc.wl
	if w == nil || w.session == nil || w.stopped {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, mc.settle()+time.Second)
	_ = w.session.WaitAcks(wctx, w.session.Acks()+20)
	cancel()
	w.stats, w.stopped = w.session.Stop(), true
}

// mgrSaveWindow is the source VMM's last completed pause → resume (one pid):
// the save whose capture made the snapshot the retry left. A killed save
// whose VMM a `start` resumed is an earlier pair.
func mgrSaveWindow(events []failpoint.Event, vmID string) (ledger.CutWindow, bool) {
	var w ledger.CutWindow
	var pauseNs int64
	pid := 0
	for _, e := range events {
		if e.VM != vmID || e.Proc != "fakech" {
			continue
		}
		switch e.Point {
		case "ch.pause":
			pauseNs, pid = e.TsNs, e.Pid
		case "ch.resume":
			if pauseNs != 0 && e.Pid == pid {
				w.PauseNs, w.ResumeNs = pauseNs, e.TsNs
				pauseNs = 0
			}
		}
	}
	return w, w.PauseNs != 0
}

// judgeCut is workload-consistent-cut of a workload case: the snapshot
// tgt, cloned with a NIC, must hold exactly the cut of the save that made
// it, and the source must have acked markers begun after that save's
// resume. Nothing judged fails it.
func (mc *mgrCase) judgeCut(ctx context.Context) reports.Invariant {
	inv := reports.Invariant{Name: WorkloadConsistentCut}
	mc.stopWorkload(ctx)
	w := mc.wl
	if w == nil {
		inv.Evidence = "not judged: the writer's ledger was never opened"
		return inv
	}
	if w.startErr != nil {
		inv.Evidence = fmt.Sprintf("%s: the writer did not start or acked nothing: %v", scenarios.MgrSrcVM, w.startErr)
		return inv
	}
	v, err := mc.cloneAndJudge(ctx)
	if err != nil {
		inv.Evidence = "not judged: " + err.Error()
		return inv
	}
	w.cut = &v
	switch {
	case !v.OK:
		inv.Evidence = v.Message
	case v.BeganAfterResume == 0:
		inv.Evidence = fmt.Sprintf("%s: the source's writer acked nothing begun after the save's resume: the source did not go on (%s)", v.Snapshot, v.Message)
	default:
		inv.OK = true
		inv.Evidence = fmt.Sprintf("the clone %s of snapshot %s holds the save's cut: %s", mgrCutClone, scenarios.MgrTarget, v.Message)
	}
	return inv
}

// cloneAndJudge finds the save's window and the snapshot, clones it with a
// NIC through the manager's own clone verb and judges the clone's markers.
func (mc *mgrCase) cloneAndJudge(ctx context.Context) (ledger.CutVerdict, error) {
	srcID := mc.srcID()
	win, ok := mgrSaveWindow(mc.trace.Events(), srcID)
	if !ok {
		return ledger.CutVerdict{}, fmt.Errorf("no completed pause → resume of %s's VMM (%s) in the trace: no save finished under the writer", scenarios.MgrSrcVM, srcID)
	}
	snaps, err := mc.m.Snapshots(ctx)
	if err != nil {
		return ledger.CutVerdict{}, fmt.Errorf("snapshot list: %w", err)
	}
	found := false
	for _, s := range snaps {
		found = found || (s.Name == scenarios.MgrTarget && s.State != "pending") // a manager without states lists only finished ones
	}
	if !found {
		return ledger.CutVerdict{}, fmt.Errorf("no ready snapshot %q is listed after the recovery: the save and its retry left none to clone", scenarios.MgrTarget)
	}
	clone := manager.Call{Verb: manager.VerbClone, Snapshot: scenarios.MgrTarget, Name: mgrCutClone, NICs: oneNIC()}
	if res := mc.verb(ctx, clone); res.err != nil {
		return ledger.CutVerdict{}, fmt.Errorf("the clone of the snapshot: %s", res)
	}
	g, err := mc.guestOf(ctx, mgrCutClone)
	if err != nil {
		return ledger.CutVerdict{}, err
	}
	win.Snapshot, win.FaultNs, win.GuestClock = scenarios.MgrTarget, mc.faultNs, true
	jctx, cancel := context.WithTimeout(ctx, 30*time.Second) // a safety net for the guest's SSH
	defer cancel()
	v, err := mc.wl.led.JudgeCut(jctx, scenarios.MgrSrcVM, g, win, true)
	if err != nil && errors.Is(err, ledger.ErrJournal) {
		return v, harnessErr(err)
	}
	return v, err
}

// workloadReport is the case's workload section: the session, the cut and
// the acks drawn against the source's pauses, resumes and the fault.
func (mc *mgrCase) workloadReport() *reports.Workload {
	w := mc.wl
	if w == nil {
		return nil
	}
	out := &reports.Workload{Rate: ledger.DefaultWorkloadRate}
	if w.startErr != nil {
		out.Note = w.startErr.Error()
	}
	if w.stopped {
		st := w.stats
		rate := 0.0
		if st.Elapsed > 0 {
			rate = float64(st.Acks) / st.Elapsed.Seconds()
		}
		out.Sessions = append(out.Sessions, reports.WorkloadSession{Guest: st.Guest, First: st.First, Last: st.Last, Acks: st.Acks,
			AckedPerS: rate, End: st.End, DurationMs: float64(st.Elapsed) / 1e6})
	}
	if w.cut != nil {
		out.Cuts = append(out.Cuts, cutReport(*w.cut))
	}
	srcID := mc.srcID()
	for _, e := range mc.phases {
		if e.VM == srcID && (e.Point == "ch.pause" || e.Point == "ch.resume") {
			out.Marks = append(out.Marks, reports.WorkloadMark{TsNs: e.TsNs, Kind: strings.TrimPrefix(e.Point, "ch."), Label: scenarios.MgrSrcVM + " " + e.Point})
		}
	}
	for _, in := range mc.rc.Injections {
		if in.ActualNs > 0 {
			out.Marks = append(out.Marks, reports.WorkloadMark{TsNs: in.ActualNs, Kind: "fault", Label: in.Fault})
		}
	}
	out.Acks = journalAcks(w.led.JournalPath(), true, out.Marks)
	return out
}

// srcID is the fixture VM's id, from the baseline's listing.
func (mc *mgrCase) srcID() string {
	for id, name := range mc.beforeNames {
		if name == "vm "+scenarios.MgrSrcVM {
			return id
		}
	}
	return ""
}
