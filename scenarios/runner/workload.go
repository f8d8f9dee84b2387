package runner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/nodeagent"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/checker"
	"github.com/vmchaos/vmchaos/scenarios/stack"
	vmctlapi "github.com/vmchaos/vmchaos/vmctl/api"
)

// The guest workload in the runner (issue #13). Every guest that gets a
// ledger marker also gets a writer (ledger.StartWorkload) that runs through
// the case's operation windows: direct saves, the hibernate until its NIC
// drop cuts the session. Afterwards:
//
//   - each direct save that produced a snapshot is cloned (`vm clone`, by
//     the harness, unarmed) and the clone's markers are judged as a
//     consistent cut of the save's pause/resume window;
//   - a guest that went through hibernate → wake is judged against the NIC
//     drop (every marker acked before it present, boot id unchanged).
//
// The fake guest simulates the writer; a real guest runs cmd/vmchaos-writer,
// which `vmchaos image real` installs (a guest without it gets a note that
// says so). Only the fake guest's clock is the trace clock (guestClock).

// WorkloadConsistentCut is the invariant of the cut verdicts.
const WorkloadConsistentCut = "workload-consistent-cut"

// workloads is the writer state of one case.
type workloads struct {
	mu       sync.Mutex
	rate     float64
	running  map[string]*ledger.Workload
	started  map[string]time.Time
	ids      map[string]string // VM id → guest name, for the guests that ran a writer
	sessions []reports.WorkloadSession
	saves    []wlSave
	cuts     []ledger.CutVerdict
	notes    []string
	// startFails are the writers that did not start (issue 31 item 4):
	// each fails workload-consistent-cut, as a harness error only when the
	// harness's own side of the session failed (writerFailure.harness).
	startFails []writerFailure
}

// writerFailure is a writer that did not start in guest.
type writerFailure struct {
	guest   string
	err     error
	harness bool
}

// harnessSideWriterError: the writer did not start because the harness's
// own side failed — its SSH key refused, its journal not written, a guest it
// named without an address (ledger.ErrHarnessSSH) — or because the guest
// image the harness built lacks the writer (exit 127). Anything else (the
// guest unreachable, another host key, the writer run and failed, no VM to
// start it in) is the product's.
func harnessSideWriterError(err error) bool {
	var ce *ledger.CommandError
	return errors.Is(err, ledger.ErrHarnessSSH) || errors.Is(err, ledger.ErrJournal) || (errors.As(err, &ce) && ce.Status == 127)
}

// wlSave is a direct save taken while the writer of its VM ran.
type wlSave struct {
	vm, id  string
	startNs int64
}

func (cr *caseRun) wl() *workloads {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	if cr.work == nil {
		cr.work = &workloads{rate: ledger.DefaultWorkloadRate, running: map[string]*ledger.Workload{}, started: map[string]time.Time{},
			ids: map[string]string{}}
	}
	return cr.work
}

func (w *workloads) note(format string, a ...any) {
	n := fmt.Sprintf(format, a...)
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, x := range w.notes {
		if x == n {
			return
		}
	}
	w.notes = append(w.notes, n)
}

// startWorkload starts the writer in guest name unless one runs there. A
// writer that does not start is recorded (startFails): where the case
// judges the cut it fails workload-consistent-cut with the error.
func (cr *caseRun) startWorkload(ctx context.Context, name string) {
	w := cr.wl()
	w.mu.Lock()
	prev := w.running[name]
	w.mu.Unlock()
	if prev != nil {
		select {
		case <-prev.Done():
			cr.recordSession(name, prev) // ended by itself (a NIC drop, a dead VMM)
		default:
			return
		}
	}
	id, addr, ok, err := cr.st.GuestOf(ctx, name)
	if err != nil || !ok || addr == "" {
		w.startFailed(name, fmt.Errorf("no guest address to start the writer at (listed: %v, error: %v)", ok, err), false)
		return
	}
	g := ledger.Guest{Name: name, Addr: addr}
	w.mu.Lock()
	w.ids[id] = name // its saves are the timeline's pauses and resumes
	w.mu.Unlock()
	s, err := cr.st.Ledger.StartWorkload(ctx, g, ledger.WorkloadOpts{Rate: w.rate})
	var ce *ledger.CommandError
	switch {
	case errors.As(err, &ce) && ce.Status == 127:
		w.startFailed(name, fmt.Errorf("the guest has no %s (exit 127, %s): an image from before the writer; rebuild it with `vmchaos image real`",
			ledger.WorkloadCmd, strings.TrimSpace(ce.Stderr)), true)
		return
	case err != nil:
		w.startFailed(name, err, harnessSideWriterError(err))
		return
	}
	w.mu.Lock()
	w.running[name] = s
	w.started[name] = time.Now()
	w.mu.Unlock()
}

func (w *workloads) startFailed(guest string, err error, harness bool) {
	w.note("%s: the writer did not start: %v", guest, err) // the report's workload section says it too
	w.mu.Lock()
	defer w.mu.Unlock()
	w.startFails = append(w.startFails, writerFailure{guest: guest, err: err, harness: harness})
}

// restartWorkloads starts the writer again in the guests among names that
// had one (a wake: the session ended with the hibernate's NIC drop).
func (cr *caseRun) restartWorkloads(ctx context.Context, names []string) {
	w := cr.wl()
	for _, n := range names {
		w.mu.Lock()
		_, had := w.started[n]
		w.mu.Unlock()
		if had {
			cr.startWorkload(ctx, n)
		}
	}
}

// noteSave records a direct save of name taken under its writer.
func (cr *caseRun) noteSave(name, id string) {
	w := cr.wl()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running[name] != nil {
		w.saves = append(w.saves, wlSave{vm: name, id: id, startNs: failpoint.Now()})
	}
}

// stopWorkloads ends every writer session and records its figures.
func (cr *caseRun) stopWorkloads() {
	w := cr.wl()
	w.mu.Lock()
	running := w.running
	w.running = map[string]*ledger.Workload{}
	w.mu.Unlock()
	names := make([]string, 0, len(running))
	for n := range running {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		cr.recordSession(n, running[n])
	}
}

// recordSession stops a session (a no-op when it ended) and records its
// figures.
func (cr *caseRun) recordSession(name string, s *ledger.Workload) {
	w := cr.wl()
	st := s.Stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	el := time.Since(w.started[name])
	if st.Elapsed > 0 {
		el = st.Elapsed
	}
	rate := 0.0
	if el > 0 {
		rate = float64(st.Acks) / el.Seconds()
	}
	end := st.End
	if st.Err != nil {
		end += "; journal: " + st.Err.Error()
	}
	w.sessions = append(w.sessions, reports.WorkloadSession{Guest: name, First: st.First, Last: st.Last, Acks: st.Acks,
		AckedPerS: rate, End: end, DurationMs: float64(el) / 1e6})
}

// cutCompulsory: the case must judge the workload's cut — decided from the
// case (a guest with the writer and an operation or step that takes or
// restores a snapshot: scenarios.(*Scenario).JudgesCut), or asked for by
// Expect.Workload.
func (cr *caseRun) cutCompulsory() bool { return cr.s.Expect.Workload || cr.s.JudgesCut() }

// cutFindings is everything workload-consistent-cut is decided from.
type cutFindings struct {
	cuts   []ledger.CutVerdict
	wentOn map[int]int // by cut index: the source's acks past a clone's cut
	errs   []error     // what should have been judged and could not be
	starts []writerFailure
	// noCut says why no cut can exist in the case (every guest with the
	// writer ends deleted); only with nothing else judged or wrong does
	// it let the invariant pass, and it says so in the evidence.
	noCut []string
	// killed are the saves the case's fault killed before their resume:
	// they have no snapshot of their own (evidence, not a failure).
	killed []string
}

// judgeWorkload judges every save taken under workload (through a clone of
// its snapshot) and every hibernate → wake of a guest with a writer. Where
// the cut is compulsory it always returns the invariant (nothing judged
// fails it); elsewhere only when something was judged.
func (cr *caseRun) judgeWorkload(ctx context.Context, budget time.Duration) []reports.Invariant {
	w := cr.wl()
	events := cr.st.Trace.Sorted()
	var f cutFindings
	cr.judgeSaves(ctx, budget, events, &f)
	cr.judgeWakes(ctx, budget, events, &f)
	w.mu.Lock()
	w.cuts = append(w.cuts, f.cuts...)
	f.starts = append(f.starts, w.startFails...)
	w.mu.Unlock()
	if !cr.cutCompulsory() && len(f.cuts) == 0 && len(f.errs) == 0 {
		return nil
	}
	return []reports.Invariant{cr.cutInvariant(f)}
}

// cutNotJudged is workload-consistent-cut of a compulsory case that did not
// converge: no snapshot of the operation is there to judge, so it fails.
func (cr *caseRun) cutNotJudged() reports.Invariant {
	w := cr.wl()
	w.mu.Lock()
	starts := append([]writerFailure(nil), w.startFails...)
	w.mu.Unlock()
	ev := []string{"not judged: the stack did not converge, so no snapshot of the operation holds a cut to judge"}
	for _, s := range starts {
		ev = append(ev, fmt.Sprintf("%s: the writer did not start: %v", s.guest, s.err))
	}
	return reports.Invariant{Name: WorkloadConsistentCut, Evidence: strings.Join(ev, "\n")}
}

// judgeSaves judges the cut of every harness save of the case that
// completed (a paused→resumed pair in the trace) through a clone of it, and
// counts, without the guest clock, the source's acks past each cut
// (wentOn, by cut index). A save with no pair fails the cut unless the
// case's fault killed it (savesKilledBy).
func (cr *caseRun) judgeSaves(ctx context.Context, budget time.Duration, events []failpoint.Event, f *cutFindings) {
	w := cr.wl()
	f.wentOn = map[int]int{}
	w.mu.Lock()
	saves := append([]wlSave(nil), w.saves...)
	w.mu.Unlock()
	for i, s := range saves {
		win, ok := saveWindow(events, s.id, s.startNs)
		if !ok {
			if by := savesKilledBy(cr.s); by != "" {
				f.killed = append(f.killed, fmt.Sprintf("save of %s killed by the fault (%s) before its resume: no snapshot of its own", s.vm, by))
			} else {
				f.errs = append(f.errs, fmt.Errorf("save of %s: no paused→resumed pair in the trace and no fault of the case kills a save: the save did not complete", s.vm))
			}
			continue
		}
		if by := savesKilledBy(cr.s); by != "" && !cr.snapshotReady(ctx, s.vm+"-manual") {
			// killed after its resume, before its record was final (or
			// its pending record collected since): the pair is there, the
			// snapshot is not
			f.killed = append(f.killed, fmt.Sprintf("save of %s killed by the fault (%s) after its resume, before its snapshot was final: no snapshot of its own", s.vm, by))
			continue
		}
		win.Snapshot, win.FaultNs, win.GuestClock = s.vm+"-manual", cr.faultNs, cr.guestClock()
		clone := fmt.Sprintf("%s-cut%d", s.vm, i)
		cctx, cancel := context.WithTimeout(ctx, budget)
		v, err := cr.judgeSnapshot(cctx, s.vm, win, clone)
		cancel()
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("%s: %w", win.Snapshot, err))
			continue
		}
		if !win.GuestClock {
			entries, _, err := ledger.ReadJournal(cr.st.Ledger.JournalPath())
			if err != nil {
				f.errs = append(f.errs, fmt.Errorf("%s: %w", win.Snapshot, err))
				continue
			}
			f.wentOn[len(f.cuts)] = wentOnPast(ledger.WorkloadFromJournal(entries, s.vm).Acks, win.ResumeNs, v.Cut)
		}
		f.cuts = append(f.cuts, v)
	}
}

// snapshotReady reports a ready (finalized) snapshot called name; a
// listing that fails reads as ready, so the judgement goes on and names
// the real error.
func (cr *caseRun) snapshotReady(ctx context.Context, name string) bool {
	snaps, err := cr.st.ListSnapshots(ctx)
	if err != nil {
		return true
	}
	for _, sn := range snaps {
		if sn.Name == name && sn.State == vmctlapi.SnapReady {
			return true
		}
	}
	return false
}

// savesKilledBy names the fault of s that kills a save in flight (its
// process or its VMM), "" when none does: only then may a save end without
// a resume and take no snapshot.
func savesKilledBy(s *scenarios.Scenario) string {
	for _, f := range s.Faults {
		switch f.Kind {
		case scenarios.FaultSigkillDirect, scenarios.FaultPowerCut, "sigkill-vmm":
			return f.Kind
		}
	}
	return ""
}

// vmmKilledReason is why a guest may have booted fresh because the case's
// fault (or a step) killed its VMM; "" when nothing did. Its RAM markers are
// then legitimately gone; every disk marker acked before the NIC drop is
// still required.
func vmmKilledReason(s *scenarios.Scenario) string {
	for _, f := range s.Faults {
		if f.Kind == "sigkill-vmm" {
			return "the fault killed the VMM (sigkill-vmm): its RAM is legitimately lost"
		}
	}
	if p, k := scenarios.FailpointAction(s); k == scenarios.CovFailpointKill || k == scenarios.CovFailpointExit {
		if fp, ok := failpoint.Lookup(p); ok && fp.Proc == "fakech" {
			return "the failpoint action (" + k + " at " + p + ") ended the VMM: its RAM is legitimately lost"
		}
	}
	for _, st := range append(append([]scenarios.Step{}, s.WhileStopped...), s.After...) {
		if st.Kind == scenarios.StepKillVMM {
			return "the case killed the VMM (kill-vmm step): its RAM is legitimately lost"
		}
	}
	return ""
}

// judgeWakes judges the cut every hibernate/wake cycle of a guest with a
// writer gave. A guest still hibernated (a case that does not verify the
// ledger) is woken once for it; a guest that ends deleted has no cut (noCut).
func (cr *caseRun) judgeWakes(ctx context.Context, budget time.Duration, events []failpoint.Event, f *cutFindings) {
	w := cr.wl()
	names := make([]string, 0, len(cr.cycles))
	for n := range cr.cycles {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		w.mu.Lock()
		_, wrote := w.started[n]
		w.mu.Unlock()
		if !cr.cycles[n] || !wrote { // no writer ran there (a calibration VM)
			continue
		}
		switch {
		case cr.goals[n] == checker.GoalDeleted && cr.guestNode(n) != cr.st:
			// migrated: the cut of the source's hibernate is judged on
			// the guest its target woke
		case cr.goals[n] == checker.GoalDeleted:
			f.noCut = append(f.noCut, n+" ends deleted: no guest is left to hold a cut")
			continue
		case cr.goals[n] == checker.GoalHibernated:
			if err := cr.wakeForCheck(ctx, n, budget); err != nil {
				f.errs = append(f.errs, fmt.Errorf("%s wake for the cut: %w", n, err))
				continue
			}
		}
		v, why, err := cr.judgeWake(ctx, n, events)
		switch {
		case err != nil:
			f.errs = append(f.errs, fmt.Errorf("%s wake: %w", n, err))
		case why != "":
			f.errs = append(f.errs, fmt.Errorf("%s wake: %s", n, why))
		default:
			f.cuts = append(f.cuts, v)
		}
	}
	for n, goal := range cr.goals {
		w.mu.Lock()
		_, wrote := w.started[n]
		w.mu.Unlock()
		if wrote && !cr.cycles[n] && goal == checker.GoalDeleted && cr.guestNode(n) == cr.st {
			f.noCut = append(f.noCut, n+" ends deleted: no guest is left to hold a cut")
		}
	}
	sort.Strings(f.noCut)
}

// wakeForCheck wakes a hibernated guest to list its markers (what
// verifyLedger does for the cases that verify the ledger).
func (cr *caseRun) wakeForCheck(ctx context.Context, name string, budget time.Duration) error {
	if err := cr.put(ctx, name, nodeagent.Intent{Snapshot: baseSnapshot}); err != nil {
		return err
	}
	return cr.waitGoal(ctx, name, budget)
}

// cutInvariant is WorkloadConsistentCut over the findings (issue 31 item 4):
//   - a writer that did not start fails it (a harness error when the
//     harness's own side failed, harnessSideWriterError);
//   - every cut judged must be consistent and, where the case expects the
//     workload, the source must go on past each direct save;
//   - what should have been judged and could not be fails it (a harness
//     error when only the harness's journal was unreadable);
//   - nothing judged fails it, unless the case says why no cut can exist
//     (noCut): then it passes with that reason as its evidence.
func (cr *caseRun) cutInvariant(f cutFindings) reports.Invariant {
	inv := reports.Invariant{Name: WorkloadConsistentCut, OK: true}
	var ev []string
	harness, product := 0, 0
	for _, s := range f.starts {
		ev = append(ev, fmt.Sprintf("%s: the writer did not start: %v", s.guest, s.err))
		if s.harness {
			harness++
		} else {
			product++
		}
	}
	for _, err := range f.errs {
		ev = append(ev, err.Error())
		if errors.Is(err, ledger.ErrJournal) {
			harness++
		} else {
			product++
		}
	}
	judged := 0
	for i, v := range f.cuts {
		judged += v.Judged
		if !v.OK {
			product++
			ev = append(ev, v.Message)
		}
		if msg := cr.wentOnFinding(i, v, f.wentOn); msg != "" {
			product++
			ev = append(ev, msg)
		}
	}
	switch {
	case len(ev) > 0:
		inv.OK = false
		inv.HarnessError = product == 0
		inv.Evidence = strings.Join(append(ev, f.killed...), "\n")
	case len(f.cuts) > 0:
		inv.Evidence = fmt.Sprintf("%d cut(s) consistent, %d marker(s) judged", len(f.cuts), judged) + prefixedNote(strings.Join(f.killed, "; "))
	case len(f.noCut) > 0:
		inv.Evidence = "no cut can exist: " + strings.Join(f.noCut, "; ") + prefixedNote(strings.Join(f.killed, "; "))
	default:
		w := cr.wl()
		w.mu.Lock()
		notes := strings.Join(append(append([]string(nil), f.killed...), w.notes...), "; ")
		w.mu.Unlock()
		inv.OK, inv.Evidence = false, "nothing was judged: the workload proved nothing"+prefixedNote(notes)
	}
	return inv
}

// wentOnFinding: a clone of a save must leave its source going on
// independently (where the case expects the workload).
func (cr *caseRun) wentOnFinding(i int, v ledger.CutVerdict, wentOn map[int]int) string {
	if !cr.cutCompulsory() {
		return ""
	}
	if n, ok := wentOn[i]; ok {
		if n == 0 {
			return fmt.Sprintf("%s: the source's writer acked nothing past the clone's cut %d after the save's resume: the source did not go on", v.Snapshot, v.Cut)
		}
		return ""
	}
	if v.Snapshot != "hibernate" && v.BeganAfterResume == 0 {
		return fmt.Sprintf("%s: the source's writer acked nothing begun after the save's resume: the source did not go on", v.Snapshot)
	}
	return ""
}

// guestClock: the guest's ack times are on the trace clock. The fake
// guest's clock is the host's CLOCK_MONOTONIC; a real guest's CLOCK_MONOTONIC
// counts from its own boot, so the ledger orders its acks by the host's
// receipt time and judges no PHANTOM by time.
func (cr *caseRun) guestClock() bool { return guestClockOn(cr.r.opts.Backend) }

// guestClockOn is a variable so a test can run the fake backend the way the
// real one is judged.
var guestClockOn = func(backend string) bool { return backend == stack.BackendFake || backend == "" }

// wentOnPast counts the acks the host received after resumeNs for markers
// past cut: without the guest clock, the proof that the source went on
// after the snapshot (an ack received late for a marker written before the
// pause is at most cut, or LOST in the clone).
func wentOnPast(acks []ledger.WorkloadAck, resumeNs int64, cut int) int {
	n := 0
	for _, a := range acks {
		if a.HostNs > resumeNs && a.Seq > cut {
			n++
		}
	}
	return n
}

func prefixedNote(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

// saveWindow finds the pause and resume of the save of VM id begun after
// fromNs: its first snapshot.save.paused, and snapshot.save.resumed from the
// same process (a later save of the VM, e.g. the agent's hibernate, is
// another process: a save killed while paused has no window).
func saveWindow(events []failpoint.Event, id string, fromNs int64) (ledger.CutWindow, bool) {
	var w ledger.CutWindow
	pid := 0
	for _, e := range events {
		if e.TsNs < fromNs || e.VM != id {
			continue
		}
		switch {
		case e.Point == "snapshot.save.paused" && pid == 0:
			w.PauseNs, pid = e.TsNs, e.Pid
		case e.Point == "snapshot.save.resumed" && pid != 0 && e.Pid == pid && w.ResumeNs == 0:
			w.ResumeNs = e.TsNs
		}
	}
	return w, w.PauseNs != 0 && w.ResumeNs != 0
}

// judgeSnapshot clones the save's snapshot as the harness (no failpoints, no
// trace) and judges the clone's markers; the clone's memory came from the
// capture, so its RAM markers are judged too.
func (cr *caseRun) judgeSnapshot(ctx context.Context, source string, win ledger.CutWindow, clone string) (ledger.CutVerdict, error) {
	if _, err := cr.st.Vmctl(ctx, "vm", "clone", "--name", clone, win.Snapshot); err != nil {
		return ledger.CutVerdict{}, fmt.Errorf("clone of the snapshot: %w", err)
	}
	g, err := cr.guest(ctx, clone)
	if err != nil {
		return ledger.CutVerdict{}, err
	}
	return cr.st.Ledger.JudgeCut(ctx, source, g, win, true)
}

// judgeWake judges a guest woken from a hibernate against the last NIC drop
// of that hibernate. why says why there is nothing to judge.
func (cr *caseRun) judgeWake(ctx context.Context, name string, events []failpoint.Event) (ledger.CutVerdict, string, error) {
	entries, _, err := ledger.ReadJournal(cr.st.Ledger.JournalPath())
	if err != nil {
		return ledger.CutVerdict{}, "", err
	}
	h := ledger.WorkloadFromJournal(entries, name)
	if h.Sessions == 0 {
		return ledger.CutVerdict{}, "no writer ran in the guest", nil
	}
	dropNs := nicDropNs(events, name, cr.wl().writerVMs())
	var resumeNs int64
	if dropNs == 0 && cr.r.opts.AgentCocoon != "" {
		// the agent's plan over a manager without a NIC verb (issue 33
		// item 2) saves with the NIC up: the cut is the save's own
		// pause/resume (the VMM's, fakech's points), and what the writer
		// acked after the resume is lost with the VM by that plan
		if dropNs, resumeNs = hibernateSaveWindow(events, name, cr.wl().writerVMs()); dropNs == 0 {
			return ledger.CutVerdict{}, "no NIC drop and no paused→resumed save of the hibernate in the trace: the hibernate did not run under the workload", nil
		}
	}
	if dropNs == 0 {
		return ledger.CutVerdict{}, "no NIC drop in the trace: the hibernate did not run under the workload", nil
	}
	g, err := cr.guest(ctx, name)
	if err != nil {
		return ledger.CutVerdict{}, "", err
	}
	ls, err := cr.st.Ledger.ListWorkload(ctx, g)
	if err != nil {
		return ledger.CutVerdict{}, "", err
	}
	// the boot id of the last session that started before the drop
	boot := ""
	for _, e := range entries {
		if e.Kind == ledger.KindWorkloadStart && e.Guest == name && e.HostNs < dropNs {
			boot = e.BootID
		}
	}
	if boot == "" {
		return ledger.CutVerdict{}, "", errors.New("no writer session started before the NIC drop")
	}
	cold := cr.coldBootReason()
	if cold == "" {
		cold = vmmKilledReason(cr.s)
	}
	// With the NIC up the writer acks on after the save's resume and, once
	// woken, writes again from the snapshot's last seq: the same seqs twice,
	// so no marker is judged a PHANTOM by its time (as after a NIC drop,
	// where the VM never resumes); every marker acked before the pause is
	// still required, on disk and in RAM, and the boot id unchanged.
	v := ledger.ClassifyWake(ledger.WakeInput{Guest: name, Acks: h.Acks, First: h.First, DropNs: dropNs,
		FaultNs: cr.faultNs, GuestClock: cr.guestClock(), Disk: ls.Disk, RAM: ls.RAM, BootBefore: boot, BootAfter: ls.BootID,
		ColdBootAllowed: cold})
	if resumeNs != 0 {
		// Acked after the save's resume, before the VM was removed: the
		// guest said durable, the snapshot cannot hold it, so the wake lost
		// it. That is the plan's loss (no NIC verb to stop the clients
		// first), and the ledger's job is to say so, never to excuse it.
		v = v.WithLost(ackedAfter(h.Acks, resumeNs, hibernateEndNs(events, name, dropNs), cr.guestClock()))
	}
	return v, "", nil
}

// ackedAfter lists the acks in (fromNs, toNs) (toNs 0: no end), on the
// guest clock where it is the trace clock, else by arrival, as lost
// markers: acked after the save's resume, so in no snapshot.
func ackedAfter(acks []ledger.WorkloadAck, fromNs, toNs int64, guestClock bool) []ledger.SeqAt {
	var lost []ledger.SeqAt
	for _, a := range acks {
		t := a.HostNs
		if guestClock {
			t = a.AckNs
		}
		if t > fromNs && (toNs == 0 || t < toNs) {
			lost = append(lost, ledger.SeqAt{Seq: a.Seq, When: "acked after the hibernate's save resumed the VM (NIC up): in no snapshot"})
		}
	}
	return lost
}

// hibernateEndNs is the agent's agent.hibernate.removed of name after
// fromNs: the VM and its writer are gone. 0: not in the trace.
func hibernateEndNs(events []failpoint.Event, name string, fromNs int64) int64 {
	for _, e := range events {
		if e.Point == "agent.hibernate.removed" && e.VM == name && e.TsNs > fromNs {
			return e.TsNs
		}
	}
	return 0
}

// hibernateSaveWindow is the pause and resume of the save that guest name's
// hibernate kept when the agent saved with the NIC up: fakech's ch.pause and
// the same VMM's next ch.resume, on a VM that ran name's writer, the last
// such pair before the agent's last agent.hibernate.saved of name (a retried
// save leaves earlier pairs). 0, 0: none.
func hibernateSaveWindow(events []failpoint.Event, name string, writerVMs map[string]string) (pauseNs, resumeNs int64) {
	var savedNs int64
	for _, e := range events {
		if e.Point == "agent.hibernate.saved" && e.VM == name {
			savedNs = e.TsNs
		}
	}
	pid := 0
	var p, r int64
	for _, e := range events {
		if writerVMs[e.VM] != name || (savedNs != 0 && e.TsNs > savedNs) {
			continue
		}
		switch {
		case e.Point == "ch.pause":
			p, r, pid = e.TsNs, 0, e.Pid
		case e.Point == "ch.resume" && p != 0 && r == 0 && e.Pid == pid:
			r = e.TsNs
			pauseNs, resumeNs = p, r
		}
	}
	return pauseNs, resumeNs
}

// workloadReport is the case's workload section: sessions, cuts, the acks
// (downsampled) and the marks they are drawn against.
func (cr *caseRun) workloadReport() *reports.Workload {
	w := cr.wl()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.sessions) == 0 && len(w.notes) == 0 && len(w.cuts) == 0 {
		return nil
	}
	out := &reports.Workload{Rate: w.rate, Sessions: w.sessions, Note: strings.Join(w.notes, "; ")}
	for _, v := range w.cuts {
		out.Cuts = append(out.Cuts, cutReport(v))
	}
	// only the guests with a writer (not the calibration VMs)
	events := cr.st.Trace.Sorted()
	for _, e := range events {
		name, ours := w.ids[e.VM]
		switch {
		case e.Point == "snapshot.save.paused" && ours:
			out.Marks = append(out.Marks, reports.WorkloadMark{TsNs: e.TsNs, Kind: "pause", Label: name + " " + e.Point})
		case e.Point == "snapshot.save.resumed" && ours:
			out.Marks = append(out.Marks, reports.WorkloadMark{TsNs: e.TsNs, Kind: "resume", Label: name + " " + e.Point})
		case e.Point == "agent.hibernate.nic-dropped" && w.started[e.VM] != (time.Time{}):
			out.Marks = append(out.Marks, reports.WorkloadMark{TsNs: e.TsNs, Kind: "nic-drop", Label: e.VM})
		}
	}
	for _, in := range cr.rc.Injections {
		if in.ActualNs > 0 {
			out.Marks = append(out.Marks, reports.WorkloadMark{TsNs: in.ActualNs, Kind: "fault", Label: in.Fault})
		}
	}
	out.Acks = journalAcks(cr.st.Ledger.JournalPath(), cr.guestClock(), out.Marks)
	return out
}

// cutReport is a cut verdict as the report's workload section shows it.
func cutReport(v ledger.CutVerdict) reports.WorkloadCut {
	kind := "snapshot"
	if v.Snapshot == "hibernate" {
		kind = "wake"
	}
	c := reports.WorkloadCut{Kind: kind, Snapshot: v.Snapshot, Source: v.Source, Target: v.Target, First: v.First, Cut: v.Cut,
		Present: v.Present, AckedBeforePause: v.AckedBeforePause, Judged: v.Judged, OK: v.OK, Message: v.Message}
	for _, l := range []struct {
		dst *[]string
		src []ledger.SeqAt
	}{{&c.Lost, append(v.Lost, v.RAMLost...)}, {&c.Phantom, append(v.Phantom, v.RAMPhantom...)}, {&c.Hole, append(v.Hole, v.RAMHole...)}} {
		for _, s := range l.src {
			*l.dst = append(*l.dst, fmt.Sprintf("seq %d (%s)", s.Seq, s.When))
		}
	}
	return c
}

// journalAcks are the journal's acks in time order, downsampled around
// marks; without the guest clock they are drawn at the host's receipt time
// (the trace clock the marks are on). An unreadable journal draws none.
func journalAcks(journal string, guestClock bool, marks []reports.WorkloadMark) []reports.WorkloadAckPoint {
	entries, _, err := ledger.ReadJournal(journal)
	if err != nil {
		return nil
	}
	var acks []reports.WorkloadAckPoint
	for _, e := range entries {
		if e.Kind != ledger.KindWorkloadAcks {
			continue
		}
		for _, a := range e.Acks {
			t := a.AckNs
			if !guestClock {
				t = a.HostNs
			}
			acks = append(acks, reports.WorkloadAckPoint{Guest: e.Guest, Seq: a.Seq, AckNs: t})
		}
	}
	sort.SliceStable(acks, func(i, j int) bool { return acks[i].AckNs < acks[j].AckNs })
	return downsample(acks, marks, 150)
}

// downsample keeps at most n acks, always keeping the last ack before and
// the first after every mark (the ones the cut is about).
func downsample(acks []reports.WorkloadAckPoint, marks []reports.WorkloadMark, n int) []reports.WorkloadAckPoint {
	if len(acks) <= n {
		return acks
	}
	keep := map[int]bool{0: true, len(acks) - 1: true}
	for _, m := range marks {
		i := sort.Search(len(acks), func(i int) bool { return acks[i].AckNs >= m.TsNs })
		keep[i] = true
		if i > 0 {
			keep[i-1] = true
		}
	}
	step := float64(len(acks)) / float64(n)
	for f := 0.0; int(f) < len(acks); f += step {
		keep[int(f)] = true
	}
	var out []reports.WorkloadAckPoint
	for i, a := range acks {
		if keep[i] {
			out = append(out, a)
		}
	}
	return out
}

// writerVMs is a copy of the VM id → guest name map of the writers.
func (w *workloads) writerVMs() map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.ids)
}

// nicDropNs is when guest name's NIC was dropped before its hibernate: the
// agent's agent.hibernate.nic-dropped, or, when the agent died after vmctl
// removed the NIC and before it wrote that point (its restart then resumes
// at the save and never writes it), vmctl's last vm.net.removed of a VM
// that ran name's writer before the hibernate's save. 0: no drop.
func nicDropNs(events []failpoint.Event, name string, writerVMs map[string]string) int64 {
	var agentNs, vmctlNs, savedNs int64
	for _, e := range events {
		switch {
		case e.Point == "agent.hibernate.nic-dropped" && e.VM == name:
			agentNs = e.TsNs
		case e.Point == "agent.hibernate.saved" && e.VM == name:
			savedNs = e.TsNs
		}
	}
	if agentNs != 0 {
		return agentNs
	}
	for _, e := range events {
		if e.Point == "vm.net.removed" && writerVMs[e.VM] == name && (savedNs == 0 || e.TsNs < savedNs) {
			vmctlNs = e.TsNs
		}
	}
	return vmctlNs
}
