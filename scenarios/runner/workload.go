package runner

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios/checker"
	"github.com/vmchaos/vmchaos/scenarios/stack"
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
// guest that cannot run it leaves a note, not a failure: the cases that
// need the workload fail later for lack of a verdict.
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
		w.note("%s: no guest address (%v)", name, err)
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
		w.note("%s: the guest has no %s (exit 127, %s): an image from before the writer; rebuild it with `vmchaos image real`",
			name, ledger.WorkloadCmd, strings.TrimSpace(ce.Stderr))
		return
	case err != nil:
		w.note("%s: writer did not start: %v", name, err)
		return
	}
	w.mu.Lock()
	w.running[name] = s
	w.started[name] = time.Now()
	w.mu.Unlock()
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

// judgeWorkload judges every save taken under workload (through a clone of
// its snapshot) and every hibernate → wake of a guest with a writer. It
// returns no invariant when there was nothing to judge, unless the scenario
// needs the workload.
func (cr *caseRun) judgeWorkload(ctx context.Context, budget time.Duration) []reports.Invariant {
	w := cr.wl()
	events := cr.st.Trace.Sorted()
	cuts, wentOn, errs := cr.judgeSaves(ctx, budget, events)
	wakes, werrs := cr.judgeWakes(ctx, events)
	cuts, errs = append(cuts, wakes...), append(errs, werrs...)
	w.mu.Lock()
	w.cuts = append(w.cuts, cuts...)
	w.mu.Unlock()
	if len(cuts) == 0 && len(errs) == 0 && !cr.s.Expect.Workload {
		return nil
	}
	return []reports.Invariant{cr.cutInvariant(cuts, wentOn, errs)}
}

// judgeSaves judges the cut of every harness save of the case that
// completed (a paused→resumed pair in the trace) through a clone of it, and
// counts, without the guest clock, the source's acks past each cut
// (wentOn, by cut index); errs say what could not be judged.
func (cr *caseRun) judgeSaves(ctx context.Context, budget time.Duration, events []failpoint.Event) (cuts []ledger.CutVerdict, wentOn map[int]int, errs []error) {
	w := cr.wl()
	wentOn = map[int]int{}
	w.mu.Lock()
	saves := append([]wlSave(nil), w.saves...)
	w.mu.Unlock()
	for i, s := range saves {
		win, ok := saveWindow(events, s.id, s.startNs)
		if !ok {
			w.note("save of %s: no paused→resumed pair in the trace (the save did not complete): no snapshot to judge", s.vm)
			continue
		}
		win.Snapshot, win.FaultNs, win.GuestClock = s.vm+"-manual", cr.faultNs, cr.guestClock()
		clone := fmt.Sprintf("%s-cut%d", s.vm, i)
		cctx, cancel := context.WithTimeout(ctx, budget)
		v, err := cr.judgeSnapshot(cctx, s.vm, win, clone)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", win.Snapshot, err))
			continue
		}
		if !win.GuestClock {
			entries, _, err := ledger.ReadJournal(cr.st.Ledger.JournalPath())
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", win.Snapshot, err))
				continue
			}
			wentOn[len(cuts)] = wentOnPast(ledger.WorkloadFromJournal(entries, s.vm).Acks, win.ResumeNs, v.Cut)
		}
		cuts = append(cuts, v)
	}
	return cuts, wentOn, errs
}

// judgeWakes judges the cut every hibernate/wake cycle of a guest the case
// keeps gave; errs say what could not be judged.
func (cr *caseRun) judgeWakes(ctx context.Context, events []failpoint.Event) (cuts []ledger.CutVerdict, errs []error) {
	names := make([]string, 0, len(cr.cycles))
	for n := range cr.cycles {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if !cr.cycles[n] || cr.goals[n] == checker.GoalDeleted {
			continue
		}
		v, why, err := cr.judgeWake(ctx, n, events)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s wake: %w", n, err))
		case why != "":
			cr.wl().note("%s wake: %s", n, why)
		default:
			cuts = append(cuts, v)
		}
	}
	return cuts, errs
}

// cutInvariant is WorkloadConsistentCut over the judged cuts: every cut
// consistent and, where the case expects the workload, the source going on
// past each save; nothing judged proves nothing. A cut the harness could
// not judge because its own journal was unreadable (ledger.ErrJournal) is
// the harness's error when nothing else is wrong.
func (cr *caseRun) cutInvariant(cuts []ledger.CutVerdict, wentOn map[int]int, errs []error) reports.Invariant {
	w := cr.wl()
	inv := reports.Invariant{Name: WorkloadConsistentCut, OK: len(errs) == 0 && len(cuts) > 0}
	var ev []string
	unread := 0
	for _, err := range errs {
		ev = append(ev, err.Error())
		if errors.Is(err, ledger.ErrJournal) {
			unread++
		}
	}
	judged := 0
	for i, v := range cuts {
		judged += v.Judged
		if !v.OK {
			inv.OK = false
			ev = append(ev, v.Message)
		}
		// a clone of a save must leave its source going on independently
		if n, ok := wentOn[i]; ok {
			if cr.s.Expect.Workload && n == 0 {
				inv.OK = false
				ev = append(ev, fmt.Sprintf("%s: the source's writer acked nothing past the clone's cut %d after the save's resume: the source did not go on", v.Snapshot, v.Cut))
			}
		} else if v.Snapshot != "hibernate" && cr.s.Expect.Workload && v.BeganAfterResume == 0 {
			inv.OK = false
			ev = append(ev, fmt.Sprintf("%s: the source's writer acked nothing begun after the save's resume: the source did not go on", v.Snapshot))
		}
	}
	if len(cuts) == 0 && len(ev) == 0 {
		w.mu.Lock()
		notes := strings.Join(w.notes, "; ")
		w.mu.Unlock()
		ev = append(ev, "nothing was judged: the workload proved nothing"+prefixedNote(notes))
	}
	if inv.OK {
		inv.Evidence = fmt.Sprintf("%d cut(s) consistent, %d marker(s) judged", len(cuts), judged)
	} else {
		inv.Evidence = strings.Join(ev, "\n")
		inv.HarnessError = unread > 0 && unread == len(ev)
	}
	return inv
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
	var dropNs int64
	for _, e := range events {
		if e.Point == "agent.hibernate.nic-dropped" && e.VM == name {
			dropNs = e.TsNs
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
	return ledger.ClassifyWake(ledger.WakeInput{Guest: name, Acks: h.Acks, First: h.First, DropNs: dropNs, FaultNs: cr.faultNs,
		GuestClock: cr.guestClock(), Disk: ls.Disk, RAM: ls.RAM, BootBefore: boot, BootAfter: ls.BootID,
		ColdBootAllowed: cr.coldBootReason()}), "", nil
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
		out.Cuts = append(out.Cuts, c)
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
	if entries, _, err := ledger.ReadJournal(cr.st.Ledger.JournalPath()); err == nil {
		var acks []reports.WorkloadAckPoint
		for _, e := range entries {
			if e.Kind != ledger.KindWorkloadAcks {
				continue
			}
			for _, a := range e.Acks {
				t := a.AckNs
				if !cr.guestClock() {
					t = a.HostNs // drawn against the trace's marks: on the trace clock
				}
				acks = append(acks, reports.WorkloadAckPoint{Guest: e.Guest, Seq: a.Seq, AckNs: t})
			}
		}
		sort.SliceStable(acks, func(i, j int) bool { return acks[i].AckNs < acks[j].AckNs })
		out.Acks = downsample(acks, out.Marks, 150)
	}
	return out
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
