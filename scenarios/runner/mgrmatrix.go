package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/powercut"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/checker"
)

// The manager-verb matrix beyond SIGKILL (scenarios/manager_matrix.go): the
// power cut of the node under a verb, and the frozen verb.
const (
	// AckedVerbsKept: every record a verb had acknowledged (exit 0) before
	// the cut is still listed after it (the fixture's VM and snapshots);
	// the manager's analogue of the agent's acked-intents-kept.
	AckedVerbsKept = "acked-verbs-kept"
	// BootsAfterCut: the embedder's boot after the cut (the manager's gc,
	// the fixture's VM started again) succeeded.
	BootsAfterCut = "boots-after-cut"
	// VerbEndsAfterThaw: a verb SIGSTOPped at a VMM phase and SIGCONTed
	// after its VMM finished ends (any exit), never hangs.
	VerbEndsAfterThaw = "verb-ends-after-thaw"
	// ThawedVerbResultHolds: a thawed verb that exited 0 left what it
	// reported: its object listed in the state the verb promises.
	ThawedVerbResultHolds = "thawed-verb-result-holds"
)

// mountStore puts the durable dirs the adapter names on lazy filesystems
// (before its Setup makes the store in them). A host without FUSE makes
// the case inconclusive, a precondition.
func (mc *mgrCase) mountStore() error {
	sl, ok := mc.m.(manager.StoreLayout)
	if !ok {
		return harnessErr(fmt.Errorf("the %s adapter names no store dirs to cut", mc.m.Name()))
	}
	if why := fuseAvailable(); why != "" {
		return preconditionErr(errors.New(why))
	}
	durable, volatile := sl.StoreDirs()
	node, err := powercut.Mount(durable, volatile)
	if err != nil {
		return harnessErr(fmt.Errorf("the store on lazyfs: %w", err))
	}
	mc.node = node
	return nil
}

// stopCase SIGSTOPs every process of the case (the tag's) and their
// descendants, rescanning until a scan finds none it had not stopped (a
// verb that forked between two scans), and returns them: the node frozen
// at one instant, before the power cut kills it.
func (mc *mgrCase) stopCase() ([]injector.Proc, error) {
	seen := map[injector.Proc]bool{}
	var out []injector.Proc
	var stop func(p injector.Proc)
	stop = func(p injector.Proc) {
		if seen[p] {
			return
		}
		seen[p] = true
		fd, err := injector.OpenPidFD(p)
		if err != nil {
			return // gone already, or its pid reused
		}
		_ = fd.Signal(syscall.SIGSTOP)
		_ = fd.Close()
		out = append(out, p)
		for _, c := range injector.Children(p.PID) {
			if cp, err := injector.Identify(c); err == nil {
				stop(cp)
			}
		}
	}
	for round := 0; round < 10; round++ {
		procs, err := checker.TagScan{Tag: mc.tag}.ScanProcesses()
		if err != nil {
			return out, err
		}
		n := len(out)
		for _, p := range procs {
			stop(injector.Proc{PID: p.PID, Start: p.Start})
		}
		if len(out) == n {
			return out, nil
		}
	}
	return out, fmt.Errorf("the case's processes kept forking through 10 scans")
}

// cutUnderVerb cuts the power while the verb is at its trigger (parked VMM
// or offset). The harness's event stream is stopped before the cut (it is
// the embedder's watcher: it dies with the node and starts again at the
// boot).
func (mc *mgrCase) cutUnderVerb(ctx context.Context, inj reports.Injection, w phaseWindow, rv *running, fromNs int64) (reports.Injection, error) {
	inj.RequestedNs = failpoint.Now()
	// the verb first, at once (an offset's instant); stopping the stream
	// and the scan of the rest take milliseconds
	if root, err := injector.Identify(rv.cmd.Process.Pid); err == nil {
		signalTree(root, syscall.SIGSTOP)
	}
	mc.events.stop()
	mc.events = nil
	procs, err := mc.stopCase()
	inj.ActualNs = failpoint.Now()
	if err != nil {
		_ = mc.releasePark()
		return inj, harnessErr(fmt.Errorf("freeze the node: %w", err))
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// the power-cut kind of the injector's one list, on this case's store
	_, err = injector.FaultKindPowerCut.Inject(cctx, injector.Target{Node: mc.node, Procs: procs})
	_ = mc.releasePark() // the rebooted verbs' VMMs must not park again
	if err != nil {
		inj.Err = err.Error()
		return inj, harnessErr(err)
	}
	code, err := rv.wait(ctx, 10*time.Second)
	if err != nil {
		return inj, harnessErr(err)
	}
	pid := rv.cmd.Process.Pid
	inj.VictimPID = pid
	mc.verbEvs = append(mc.verbEvs, failpoint.Event{TsNs: rv.exitNs, Point: mgrVerbExited, Pid: pid})
	if mc.mc.Parks() {
		pid = 0 // the window is the VMM's parked point
	}
	mc.landAt(&inj, w, fromNs, inj.RequestedNs, pid)
	if inj.Landed && code != -1 {
		inj.Landed, inj.Err = false, fmt.Sprintf("%s exited %d on its own before the cut", mc.mc.Op.Verb, code)
	}
	return inj, nil
}

// afterCut judges what the cut kept, then runs the embedder's boot: the
// store's check as the cut left it (where the manager has one), every
// acknowledged record still listed, the boot's verbs, and the event stream
// started again.
func (mc *mgrCase) afterCut(ctx context.Context) ([]reports.Invariant, error) {
	var invs []reports.Invariant
	if !mc.without[checker.SrcCheck] {
		invs = append(invs, recordsHaveDataAfterCut(ctx, mc.m))
	}
	invs = append(invs, mc.ackedKept(ctx))
	boot := reports.Invariant{Name: BootsAfterCut, OK: true}
	var steps []string
	for _, call := range scenarios.MgrBoot(mc.mc.Op, mc.beforeRunning) {
		res := mc.verb(ctx, call)
		steps = append(steps, res.String())
		boot.OK = boot.OK && res.err == nil
	}
	boot.Evidence = strings.Join(steps, "; ")
	invs = append(invs, boot)
	var err error
	if mc.events, err = mc.startEvents(); err != nil {
		return invs, productErr(ManagerEventStream, fmt.Errorf("the manager's event stream after the boot: %w", err))
	}
	return invs, nil
}

// ackedKept: every VM and snapshot listed before the verb under test (each
// made by a verb that exited 0) is listed after the cut, before any verb
// ran on the rebooted store; an rm under test may have removed its VM.
func (mc *mgrCase) ackedKept(ctx context.Context) reports.Invariant {
	inv := reports.Invariant{Name: AckedVerbsKept}
	vms, err := mc.m.VMs(ctx)
	if err != nil {
		inv.Evidence = "vm list after the cut: " + err.Error()
		return inv
	}
	snaps, err := mc.m.Snapshots(ctx)
	if err != nil {
		inv.Evidence = "snapshot list after the cut: " + err.Error()
		return inv
	}
	listed := map[string]bool{}
	for _, v := range vms {
		listed[v.ID] = true
	}
	for _, s := range snaps {
		listed[s.ID] = true
	}
	var lost []string
	for id := range mc.before.Records {
		if !listed[id] && !(mc.mc.Op.Verb == manager.VerbRm && mc.beforeNames[id] == "vm "+scenarios.MgrSrcVM) {
			lost = append(lost, id+" ("+mc.beforeNames[id]+")")
		}
	}
	if len(mc.before.Records) == 0 {
		inv.Evidence = "no record was listed before the verb: nothing proven"
		return inv
	}
	inv.OK = len(lost) == 0
	if inv.OK {
		inv.Evidence = fmt.Sprintf("all %d records acknowledged before the cut are listed after it", len(mc.before.Records))
	} else {
		inv.Evidence = fmt.Sprintf("acknowledged before the cut, not listed after it: %s (listed now: %d VMs, %d snapshots)",
			strings.Join(lost, ", "), len(vms), len(snaps))
	}
	return inv
}

// freezeVerb SIGSTOPs the verb (and its children) while its VMM is parked,
// releases the VMM so it finishes the request with its client frozen,
// then SIGCONTs the verb and waits for it to end.
func (mc *mgrCase) freezeVerb(ctx context.Context, inj reports.Injection, w phaseWindow, rv *running, fromNs int64) (reports.Injection, error) {
	root, err := injector.Identify(rv.cmd.Process.Pid)
	if err != nil {
		_ = mc.releasePark()
		return inj, harnessErr(fmt.Errorf("the verb: %w", err))
	}
	inj.VictimPID = root.PID
	inj.RequestedNs = failpoint.Now()
	frozen := signalTree(root, syscall.SIGSTOP)
	inj.ActualNs = failpoint.Now()
	if err := mc.releasePark(); err != nil {
		signalTree(root, syscall.SIGCONT)
		return inj, harnessErr(err)
	}
	time.Sleep(mc.settle()) // the VMM finishes; its client is frozen
	for _, p := range frozen {
		if fd, err := injector.OpenPidFD(p); err == nil {
			_ = fd.Signal(syscall.SIGCONT)
			_ = fd.Close()
		}
	}
	thawNs := failpoint.Now()
	code, err := rv.wait(ctx, verbEndWait)
	if err != nil {
		return inj, productErr(VerbEndsAfterThaw, fmt.Errorf("%s did not end within %s of its SIGCONT: %w", mc.mc.Op.Verb, verbEndWait, err))
	}
	mc.verbEvs = append(mc.verbEvs, failpoint.Event{TsNs: rv.exitNs, Point: mgrVerbExited, Pid: root.PID})
	mc.thawCode = code
	mc.verbEnd = fmt.Sprintf("%s (%d process(es) frozen) exited %d %.0fms after its SIGCONT: %s", mc.mc.Op.Verb, len(frozen), code,
		float64(rv.exitNs-thawNs)/1e6, logTail(rv.log, 1))
	mc.landAt(&inj, w, fromNs, inj.RequestedNs, 0)
	return inj, nil
}

// signalTree signals p and its descendants, parents first (a stopped
// parent forks no more), and returns whom it signalled.
func signalTree(p injector.Proc, sig syscall.Signal) []injector.Proc {
	fd, err := injector.OpenPidFD(p)
	if err != nil {
		return nil
	}
	_ = fd.Signal(sig)
	_ = fd.Close()
	out := []injector.Proc{p}
	for _, c := range injector.Children(p.PID) {
		if cp, err := injector.Identify(c); err == nil {
			out = append(out, signalTree(cp, sig)...)
		}
	}
	return out
}

// afterThaw judges a thawed verb: it ended (VerbEndsAfterThaw); one that
// exited 0 must have left what it promises, and one that failed gets the
// embedder's recovery (its retry under the same names must succeed).
func (mc *mgrCase) afterThaw(ctx context.Context) []reports.Invariant {
	invs := []reports.Invariant{{Name: VerbEndsAfterThaw, OK: true, Evidence: mc.verbEnd}}
	if mc.thawCode == 0 {
		return append(invs, mc.resultHolds(ctx))
	}
	invs = append(invs, mc.recover(ctx))
	if mc.mc.Op.Verb == manager.VerbClone {
		invs = append(invs, mc.nameFreed())
	}
	return invs
}

// resultHolds: the object of a verb that reported success is listed as the
// verb promises (clone: tgt running; save: snapshot tgt ready; restore,
// start: src running; stop: src stopped; rm: src gone).
func (mc *mgrCase) resultHolds(ctx context.Context) reports.Invariant {
	inv := reports.Invariant{Name: ThawedVerbResultHolds}
	vms, err := mc.m.VMs(ctx)
	if err != nil {
		inv.Evidence = "vm list: " + err.Error()
		return inv
	}
	snaps, err := mc.m.Snapshots(ctx)
	if err != nil {
		inv.Evidence = "snapshot list: " + err.Error()
		return inv
	}
	state := func(name string) string {
		for _, v := range vms {
			if v.Name == name {
				return v.State
			}
		}
		return "absent"
	}
	var got, want string
	switch mc.mc.Op.Verb {
	case manager.VerbClone:
		got, want = state(scenarios.MgrTarget), manager.StateRunning
	case manager.VerbRestore, manager.VerbStart:
		got, want = state(scenarios.MgrSrcVM), manager.StateRunning
	case manager.VerbStop:
		got, want = state(scenarios.MgrSrcVM), manager.StateStopped
	case manager.VerbRm:
		got, want = state(scenarios.MgrSrcVM), "absent"
	case manager.VerbSnapshotSave:
		got, want = "absent", "ready"
		for _, s := range snaps {
			if s.Name == scenarios.MgrTarget {
				got = s.State
			}
		}
	default:
		inv.Evidence = fmt.Sprintf("no promise known for %s", mc.mc.Op.Verb)
		return inv
	}
	// a list without a snapshot state (cocoon lists only finished ones)
	// shows a listed snapshot as ready
	if got == "" && mc.mc.Op.Verb == manager.VerbSnapshotSave {
		got = "ready"
	}
	inv.OK = got == want
	inv.Evidence = fmt.Sprintf("%s exited 0 after the thaw; its object is %s (want %s)", mc.mc.Op.Verb, got, want)
	return inv
}
