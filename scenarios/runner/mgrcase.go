package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/powercut"
	"github.com/vmchaos/vmchaos/regress"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/checker"
)

// Manager-case invariants the runner judges itself (the state ones are the
// checker's table).
const (
	ManagerSetup         = "manager-setup"           // the manager made its store and the fixture (create, save base)
	ManagerCalibration   = "manager-calibration"     // the unarmed runs that measure the verb's window succeeded
	ManagerEventStream   = "manager-event-stream"    // the event stream started, stayed up and printed what its adapter reads
	ManagerListed        = "manager-listed"          // the list verbs answered before the verb (the baseline)
	RecoveryVerbSucceeds = "recovery-verb-succeeds"  // the embedder's retry, under the same names, succeeded
	NameFreedByRecovery  = "name-freed-by-recovery"  // after the manager's own recovery (its stale-create verb, gc) no record of the dead clone/create holds the name (seed 001 #1, 002)
	VMMDeathSeen         = "vmm-death-seen"          // the event stream reported a kill -9 of a VMM
	EventsMatchState     = "events-match-state"      // the stream ends where the store ends
	VerbEndsWhenVMMDies  = "verb-ends-when-vmm-dies" // a verb whose VMM was kill -9ed under it ends (any exit), never hangs
)

// Convergence of a manager case: every verb has exited, so the budget is
// short; the polls are those of every case.
const mgrConvergeBudget = 10 * time.Second

// mgrCase is one manager-verb case in flight.
type mgrCase struct {
	r        *Runner
	c        scenarios.Case
	mc       *scenarios.MgrCase
	rc       *reports.Case
	m        manager.Manager
	dir      string // the store (and sockets)
	caseDir  string // the case's report dir
	ctl      string
	tag      string
	trace    *injector.Trace
	seq      int
	events   *mgrEvents
	timeline []reports.TimelineEvent
	verbEvs  []failpoint.Event // the verb under test's start and exit (landing)
	phases   []failpoint.Event // the trace, kept at teardown
	before   *checker.StoreListing
	nameHeld []string // a dead verb's record holding the retry's name after the manager's own recovery (retryRefused)
	without  map[checker.Source]bool
	faultNs  int64
	second   *reports.Injection // a double fault's second injection
	verbEnd  string             // VMMOnly: how the verb ended after its VMM's death
	bugs     []string           // VMCHAOS_REGRESS of the bundled vmctl (selftest, a planted bug)
	node     *powercut.Node     // PowerCut: the store's durable dirs on lazyfs
	thawCode int                // Freeze: the thawed verb's exit code
	// beforeNames names the records of the baseline ("vm src",
	// "snapshot base"): evidence, and the rm under test's own VM
	beforeNames   map[string]string
	beforeRunning []string     // the VMs running before the verb: the boot after a cut starts them
	wl            *mgrWorkload // Workload: the guest writer and its cut (mgrworkload.go)
}

// runMgrCase runs one manager-verb case end to end through the one
// verdict function (verdictOf).
func (r *Runner) runMgrCase(ctx context.Context, c scenarios.Case, bugs []string, runSuffix string) reports.Case {
	s := c.Scenario
	rc := reports.Case{ID: c.ID, Scenario: s.ID, Title: s.Title, SeedRef: s.SeedRef, Labels: c.Labels, Backend: "fake",
		Supervisor: "none", TimeScale: r.opts.Scale, Seed: r.opts.Seed, Operation: s.Op, Fault: faultsString(s),
		StartedAt: time.Now().UTC(), Attempts: 1, Repro: r.mgrRepro(c, bugs), ConvergeMs: -1}
	if len(bugs) > 0 && r.mgr.name != "vmctl" {
		rc.Verdict, rc.Reason, rc.Culprit = verdictOf(outcome{Err: preconditionErr(fmt.Errorf("the regress switches %s are vmctl's, not %s's", strings.Join(bugs, ","), r.mgr.name))})
		return rc
	}
	mc := &mgrCase{r: r, c: c, mc: s.Mgr, rc: &rc, bugs: bugs, dir: r.nextMgrDir("m"),
		caseDir: filepath.Join(r.opts.ReportDir, "cases", unsafeChars.ReplaceAllString(c.ID+runSuffix, "_"))}
	mc.tag = EnvCaseTag + "=" + mc.dir
	_ = os.RemoveAll(mc.caseDir)
	if s.Mgr.DiscoverErr != "" {
		// The verb failed unarmed, before any fault: the manager's own
		// failure, with the discovery's error (and its logs' place) as evidence.
		err := productErr(ManagerCalibration, fmt.Errorf("%s run unarmed on a fresh store failed: %s", s.Mgr.Op.Verb, s.Mgr.DiscoverErr))
		rc.Invariants = append(rc.Invariants, reports.Invariant{Name: ManagerCalibration, Evidence: err.(*caseError).err.Error()})
		rc.Verdict, rc.Reason, rc.Culprit = verdictOf(outcome{Err: err})
		return rc
	}
	// a manager case marks no timed part: an alone one holds the machine
	// from its setup to the end of its convergence
	ck := &clock{g: ClockGateOf(ctx)}
	o := outcome{Err: ck.enter(ctx)}
	if o.Err == nil {
		o = mc.run(ctx)
	}
	ck.leave()
	if o.Err == nil && errors.Is(ctx.Err(), context.Canceled) {
		o.Err = harnessErr(fmt.Errorf("run interrupted: %w", ctx.Err()))
	}
	mc.stopWorkload(ctx) // before the teardown kills its guest
	o.TeardownErr = mc.teardown()
	if ce, ok := o.Err.(*caseError); ok && ce.who == byProduct {
		rc.Invariants = append(rc.Invariants, reports.Invariant{Name: ce.invariant, Evidence: ce.err.Error()})
	}
	reports.AttributeLayers(rc.Invariants)
	rc.Verdict, rc.Reason, rc.Culprit = verdictOf(o)
	rc.Logs = mgrLogFiles(r.opts.ReportDir, mc.caseDir)
	rc.Timeline = mc.buildTimeline()
	rc.Workload = mc.workloadReport()
	return rc
}

// run sets the case up, injects, recovers and converges. A manager that
// fails its own setup, fixture, calibration, listing or event stream is a
// product failure with that evidence; inconclusive is only a fault that
// missed its window (issue 32 item 5).
func (mc *mgrCase) run(ctx context.Context) outcome {
	if err := mc.prepare(ctx); err != nil {
		return outcome{Err: err}
	}
	var window time.Duration
	var err error
	if mc.mc.Trigger != scenarios.MgrTrigRace { // a race parks: no window to measure
		if window, err = mc.calibrate(ctx); err != nil {
			return outcome{Err: err}
		}
	}
	if err := mc.baseline(ctx); err != nil {
		return outcome{Err: err}
	}
	if mc.events, err = mc.startEvents(); err != nil {
		return outcome{Err: productErr(ManagerEventStream, fmt.Errorf("the manager's event stream: %w", err))}
	}
	if mc.mc.Workload {
		if err := mc.startWorkload(ctx); err != nil {
			return outcome{Err: err}
		}
	}
	inj, invs, err := mc.fault(ctx, window)
	mc.rc.Injections = []reports.Injection{inj}
	if mc.second != nil {
		mc.rc.Injections = append(mc.rc.Injections, *mc.second)
	}
	mc.rc.Trigger, mc.rc.LandedPhase = inj.Trigger, inj.LastPhase
	if err != nil {
		return outcome{Err: err}
	}
	if !inj.Landed {
		return outcome{NotLanded: []string{inj.Err}}
	}
	mc.faultNs = inj.ActualNs
	state, convergedNs := converge(ctx, mc.input(), mgrConvergeBudget, floor(mc.r.scale(time.Second), 50*time.Millisecond), mc.r.opts.StablePolls, nil)
	if convergedNs > 0 {
		mc.rc.ConvergeMs = float64(convergedNs-inj.ActualNs) / 1e6
	}
	invs = append(invs, state...)
	invs = append(invs, mc.streamMatches(ctx))
	if mc.mc.Workload {
		// after the state was judged: the judgement's clone is no object
		// of the case's recovery
		invs = append(invs, mc.judgeCut(ctx))
	}
	mc.rc.Invariants = append([]reports.Invariant{{Name: checker.FaultLanded, OK: true,
		Evidence: fmt.Sprintf("%s %s, landed in %s", inj.Fault, inj.Trigger, inj.LastPhase)}}, invs...)
	return outcome{Invariants: mc.rc.Invariants, Converged: convergedNs > 0, Budget: mgrConvergeBudget}
}

// fault delivers the case's fault and what the manager's recovery after it
// proves: a race's own invariants (nothing to recover from), else the
// embedder's recovery and, for a create or clone, the name it frees.
func (mc *mgrCase) fault(ctx context.Context, window time.Duration) (reports.Injection, []reports.Invariant, error) {
	if mc.mc.Trigger == scenarios.MgrTrigRace {
		return mc.race(ctx)
	}
	inj, err := mc.inject(ctx, window)
	if err != nil || !inj.Landed {
		return inj, nil, err
	}
	var invs []reports.Invariant
	if mc.mc.Freeze {
		return inj, mc.afterThaw(ctx), nil
	}
	if mc.mc.PowerCut {
		if invs, err = mc.afterCut(ctx); err != nil {
			return inj, invs, err
		}
	}
	if mc.mc.Trigger == scenarios.MgrTrigKillVMM {
		invs = append(invs, mc.deathSeen(ctx, inj.ActualNs))
	}
	if mc.mc.VMMOnly {
		invs = append(invs, reports.Invariant{Name: VerbEndsWhenVMMDies, OK: true, Evidence: mc.verbEnd})
	}
	invs = append(invs, mc.recover(ctx))
	if v := mc.mc.Op.Verb; v == manager.VerbClone || v == manager.VerbCreate {
		invs = append(invs, mc.nameFreed())
	}
	return inj, invs, nil
}

// input is the checker's view of a manager case: the manager's Observer,
// its processes by the case's tag, no agent, and every verb exited.
func (mc *mgrCase) input() *checker.Input {
	harness := map[int]bool{}
	if mc.events != nil && mc.events.rv.cmd.Process != nil {
		harness[mc.events.rv.cmd.Process.Pid] = true
	}
	if h, ok := mc.m.(interface{ HarnessPIDs() []int }); ok {
		for _, pid := range h.HarnessPIDs() { // the adapter's own (cocoon's net holder)
			harness[pid] = true
		}
	}
	return &checker.Input{Manager: mc.m, Procs: checker.TagScan{Tag: mc.tag, Harness: harness},
		Agentless: true, Quiescent: true, Without: mc.without, BaseName: mc.untouched(),
		Store: func() ([]string, error) { return checker.ListStoreDirs(mc.dir) }, StoreBefore: mc.before}
}

// untouched is the snapshot no verb of the case may touch: base, or the
// kept one of a race whose racer removes base.
func (mc *mgrCase) untouched() string {
	if r := mc.mc.Race; r != nil && r.Racer.Verb == manager.VerbSnapshotRm && r.Racer.Snapshot == scenarios.MgrBaseSnap {
		return scenarios.MgrKeepSnap
	}
	return scenarios.MgrBaseSnap
}

// prepare makes the case's store: dirs, trace, the adapter with the case's
// environment, its Setup and the fixture (src running, base saved, the
// op's own fixture).
func (mc *mgrCase) prepare(ctx context.Context) error {
	mc.ctl = filepath.Join(mc.dir, "ctl")
	for _, d := range []string{mc.dir, mc.ctl, filepath.Join(mc.caseDir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return harnessErr(err)
		}
	}
	var err error
	if mc.trace, err = injector.ListenTrace(filepath.Join(mc.dir, "t.sock")); err != nil {
		return harnessErr(err)
	}
	env := []string{mc.tag, mc.r.mgr.record.Tag(),
		"VMCHAOS_TIME_SCALE=" + strconv.FormatFloat(mc.r.opts.Scale, 'g', -1, 64),
		"FAKECH_JITTER_SEED=" + strconv.FormatInt(mc.r.opts.Seed, 10),
		failpoint.EnvTrace + "=" + mc.trace.Path(),
		failpoint.EnvCtl + "=" + mc.ctl,
	}
	if len(mc.bugs) > 0 {
		env = append(env, regress.Env+"="+strings.Join(mc.bugs, ","))
	}
	if mc.mc.Parks() {
		// Every VMM of the case is born with the pause armed (the fixture's
		// VMM is the one a save or rm talks to), and passes straight
		// through while the release file exists: the harness removes it
		// only for the verb under test.
		env = append(env, failpoint.EnvFailpoints+"="+mc.mc.Point+"=pause")
		if err := mc.releasePark(); err != nil {
			return harnessErr(err)
		}
	}
	mr := mc.r.mgr
	o := manager.Options{Bin: mr.bin, Config: mr.config, Dir: mc.dir, VMMDir: mr.binDir, Image: mr.image, Env: env, OneFS: mc.mc.PowerCut}
	if mc.mc.Workload {
		o.NetPool = mgrNetPool(mr.tmp, mc.dir)
	}
	if mc.m, err = NewManager(mr.name, o); err != nil {
		return harnessErr(err)
	}
	if mc.mc.Workload {
		// the writer needs a guest the harness reaches: a host without
		// what the adapter needs for it (cocoon: the CNI plugins, root)
		// makes the case inconclusive with that reason (results.json
		// not_run), never a run over a silent --nics 0
		if ok, why := manager.GuestNetOf(mc.m); !ok {
			return preconditionErr(fmt.Errorf("%s%s", guestNetPrefix, why))
		}
	}
	if mc.mc.PowerCut {
		if err := mc.mountStore(); err != nil {
			return err
		}
	}
	if err := mc.m.Setup(ctx); err != nil {
		return productErr(ManagerSetup, fmt.Errorf("%s setup: %w", mr.name, err))
	}
	fixture := []manager.Call{{Verb: manager.VerbCreate, Name: scenarios.MgrSrcVM},
		{Verb: manager.VerbSnapshotSave, VM: scenarios.MgrSrcVM, Name: scenarios.MgrBaseSnap}}
	if mc.mc.Workload {
		fixture[0].NICs = oneNIC() // the guest the writer runs in
	}
	for _, call := range append(fixture, mc.mc.Op.Fixture...) {
		if res := mc.verb(ctx, call); res.err != nil {
			return productErr(ManagerSetup, fmt.Errorf("fixture: %s", res))
		}
	}
	mc.without = map[checker.Source]bool{}
	if _, err := mc.m.Check(ctx); errors.Is(err, manager.ErrNotSupported) {
		mc.without[checker.SrcCheck] = true // no check verb: its invariants are not judged
	}
	return nil
}

// calibrate measures the verb's window on the case's own store (offset
// cases): the shortest of three unarmed runs, so a load hiccup in one does
// not stretch every offset past the end of the real run.
func (mc *mgrCase) calibrate(ctx context.Context) (time.Duration, error) {
	if mc.mc.Trigger != scenarios.MgrTrigOffset {
		return 0, nil
	}
	var window time.Duration
	for i := 0; i < 3; i++ {
		for _, call := range mc.mc.Op.Calibrate {
			call = calibName(call, i)
			res := mc.verb(ctx, call)
			if res.err != nil {
				return 0, productErr(ManagerCalibration, fmt.Errorf("calibration: %s", res))
			}
			if call.Verb == mc.mc.Op.Verb && (window == 0 || res.dur < window) {
				window = res.dur
			}
		}
	}
	if window <= 0 {
		return 0, harnessErr(fmt.Errorf("calibration did not run %s", mc.mc.Op.Verb))
	}
	_ = os.WriteFile(filepath.Join(mc.caseDir, "window.txt"), []byte(fmt.Sprintf("window %s (measured: unarmed %s on this case's store), offset %.0f%% = %s\n",
		window, mc.mc.Op.Verb, mc.mc.Fraction*100, time.Duration(float64(window)*mc.mc.Fraction))), 0o644)
	return window, nil
}

// baseline lists the store and its records before the verb under test:
// what no-leftover-temp-dirs compares with.
func (mc *mgrCase) baseline(ctx context.Context) error {
	dirs, err := checker.ListStoreDirs(mc.dir)
	if err != nil {
		return harnessErr(err)
	}
	vms, err := mc.m.VMs(ctx)
	if err != nil {
		return productErr(ManagerListed, fmt.Errorf("vm list before the verb: %w", err))
	}
	snaps, err := mc.m.Snapshots(ctx)
	if err != nil {
		return productErr(ManagerListed, fmt.Errorf("snapshot list before the verb: %w", err))
	}
	mc.before = checker.NewStoreListing(dirs, vms, snaps)
	mc.beforeNames = map[string]string{}
	mc.beforeRunning = nil
	for _, v := range vms {
		mc.beforeNames[v.ID] = "vm " + v.Name
		if v.State == manager.StateRunning {
			mc.beforeRunning = append(mc.beforeRunning, v.Name)
		}
	}
	for _, s := range snaps {
		mc.beforeNames[s.ID] = "snapshot " + s.Name
	}
	mc.r.mu.Lock()
	mc.before.Layout = mc.r.mgr.layout[mc.mc.Op.Verb]
	mc.r.mu.Unlock()
	return nil
}

// calibName gives the i-th calibration run its own object names.
func calibName(c manager.Call, i int) manager.Call {
	for _, p := range []*string{&c.VM, &c.Name} {
		if *p == scenarios.MgrCalib {
			*p = fmt.Sprintf("%s-%d", scenarios.MgrCalib, i)
		}
	}
	return c
}

// releasePark lets every hit of the armed point pass.
func (mc *mgrCase) releasePark() error {
	return os.WriteFile(filepath.Join(mc.ctl, mc.mc.Point+".release"), nil, 0o644)
}

// buildTimeline merges the verbs, the VMM phases of the trace, the fault
// and the convergence, in time order.
func (mc *mgrCase) buildTimeline() []reports.TimelineEvent {
	tl := append([]reports.TimelineEvent(nil), mc.timeline...)
	for _, e := range mc.phases {
		tl = append(tl, reports.TimelineEvent{TsNs: e.TsNs, Kind: "phase", Proc: e.Proc, Point: e.Point, VM: e.VM})
	}
	for _, inj := range mc.rc.Injections {
		if inj.ActualNs > 0 {
			tl = append(tl, reports.TimelineEvent{TsNs: inj.ActualNs, Kind: "fault", Note: inj.Fault + " " + inj.Trigger})
		}
	}
	if mc.rc.ConvergeMs >= 0 && mc.faultNs > 0 {
		tl = append(tl, reports.TimelineEvent{TsNs: mc.faultNs + int64(mc.rc.ConvergeMs*1e6), Kind: "converged"})
	}
	sort.SliceStable(tl, func(i, j int) bool { return tl[i].TsNs < tl[j].TsNs })
	return tl
}

// teardown stops the event stream, kills every process of the case (the
// VMMs outlive the verbs by design) through their pidfds, verifies none is
// left, and keeps the trace. A scan that fails is a teardown error.
func (mc *mgrCase) teardown() error {
	var errs []string
	mc.events.stop()
	scan := checker.TagScan{Tag: mc.tag}
	procs, err := scan.ScanProcesses()
	if err != nil {
		errs = append(errs, err.Error())
	}
	for _, p := range procs {
		if _, err := killPID(p.PID); err != nil && alive(p.PID) {
			errs = append(errs, err.Error())
		}
	}
	if left, err := scan.ScanProcesses(); err != nil || len(left) > 0 {
		errs = append(errs, fmt.Sprintf("teardown left %d process(es): %v (%v)", len(left), left, err))
	}
	if mc.trace != nil {
		mc.phases = mc.trace.Events()
		if err := mc.trace.WriteJSONL(filepath.Join(mc.caseDir, "trace.jsonl")); err != nil {
			errs = append(errs, err.Error())
		}
		mc.trace.Close()
	}
	keepStoreLogs(mc.dir, filepath.Join(mc.caseDir, "store-logs")) // before a lazy mount goes
	if mc.node != nil {
		if err := mc.node.Unmount(); err != nil {
			errs = append(errs, "unmount the store's lazyfs: "+err.Error())
		}
	}
	_ = os.RemoveAll(mc.dir)
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// keepStoreLogs copies the logs the manager and its VMMs wrote into the
// case's store (*.log, a bounded number and size) into dst before the store
// goes: the evidence of a VMM that died under a verb, which only its own
// log explains.
func keepStoreLogs(store, dst string) {
	const most, maxSize = 40, 1 << 20
	n := 0
	_ = filepath.WalkDir(store, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".log") || n >= most {
			return nil
		}
		if fi, err := d.Info(); err != nil || !fi.Mode().IsRegular() || fi.Size() > maxSize {
			return nil
		}
		rel, err := filepath.Rel(store, p)
		if err != nil {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		out := filepath.Join(dst, strings.ReplaceAll(rel, string(filepath.Separator), "_"))
		if os.MkdirAll(dst, 0o755) == nil && os.WriteFile(out, b, 0o644) == nil {
			n++
		}
		return nil
	})
}

// mgrLogFiles maps the case's files to paths relative to the run dir.
func mgrLogFiles(runDir, caseDir string) map[string]string {
	out := map[string]string{}
	ents, _ := os.ReadDir(filepath.Join(caseDir, "logs"))
	for _, e := range ents {
		rel, err := filepath.Rel(runDir, filepath.Join(caseDir, "logs", e.Name()))
		if err == nil {
			out[strings.TrimSuffix(e.Name(), ".log")] = rel
		}
	}
	for _, f := range []string{"trace.jsonl", "events.jsonl", "window.txt"} {
		if _, err := os.Stat(filepath.Join(caseDir, f)); err == nil {
			rel, _ := filepath.Rel(runDir, filepath.Join(caseDir, f))
			out[strings.TrimSuffix(f, filepath.Ext(f))] = rel
		}
	}
	return out
}

// nameFreed judges name-freed-by-recovery: the manager's own recovery verbs
// (the stale-create verb where it has one, gc) ran before the retry; a
// retry then refused by a record the killed verb made means the dead
// clone's placeholder still held the name, which an embedder can only
// clear by deleting it by id (the field's seed 001 #1 and 002).
func (mc *mgrCase) nameFreed() reports.Invariant {
	if len(mc.nameHeld) > 0 {
		return reports.Invariant{Name: NameFreedByRecovery, Evidence: strings.Join(mc.nameHeld, "; ")}
	}
	return reports.Invariant{Name: NameFreedByRecovery, OK: true,
		Evidence: "the retry under the dead verb's name was not refused by a record the dead verb left"}
}
