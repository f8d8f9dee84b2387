// Package runner executes catalogue cases against the bundled stack: it
// builds the case's stack, runs the setup, arms and injects the faults,
// restores service like an operator, waits for a converged and stable state,
// verifies the ledger and fills a reports.Case. The Ginkgo suite and every
// `vmchaos` subcommand run cases through this one package.
package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/realch"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/checker"
	"github.com/vmchaos/vmchaos/scenarios/stack"
	"github.com/vmchaos/vmchaos/stackbin"
)

// Options configure a Runner.
type Options struct {
	ReportDir   string
	Backend     string // fake | real
	Supervisor  string // auto | sandbox | builtin | systemd
	Scale       float64
	Seed        int64
	Regress     []string
	Progress    io.Writer // one line per finished case; nil = silent
	StablePolls int       // consecutive clean polls that count as converged (default 3)
	Repeat      int       // runs of every case (default 1); differing verdicts make it flaky
	BinDir      string    // the stack binaries ("" = stackbin.Dir(); a test points it at a variant)
	Lazyfs      bool      // every case's durable dirs on lazyfs (power-cut cases always are)
	StackFS     string    // where the stacks live: auto | tmpfs | disk (stack.RunOptions.StackFS)

	// Done is called with each finished case (progress.Meter.Case); nil = none.
	Done func(reports.Case)

	// Manager, when set, makes this a run of the manager-verb cases
	// (layer:manager, manager.go) against that manager's adapter: vmctl or
	// cocoon; ManagerBin is its binary (vmctl: default the bundled one),
	// ManagerConfig its own config file.
	Manager, ManagerBin, ManagerConfig string
	// AgentCocoon, when set, runs the agent cases with their nodeagent over
	// this cocoon binary (agentcocoon.go; CocoonAgentCases picks the cases).
	AgentCocoon string
}

// preflight, binDir and newRun are realch.Preflight, stackbin.Dir and
// stack.NewRun; tests replace them to see how a real run is put together
// without KVM, a build or a namespace.
var (
	preflight = realch.Preflight
	binDir    = stackbin.Dir
	newRun    = stack.NewRun
	// cocoonNetPreflight is what the agent over cocoon needs for its VMs'
	// NICs (tests replace it)
	cocoonNetPreflight = stack.CocoonNetPreflight
)

// realAutoNote is what the run header and report say when auto picked the
// supervisor of a real-backend run.
const realAutoNote = "auto, not sandbox: the sandbox would hide the real backend's /run/netns"

// cocoonAutoNote is what the run header says when auto picked the
// supervisor of an agent-over-cocoon run.
const cocoonAutoNote = "auto, not sandbox: cocoon runs in the case's network namespace, entered by its host pid"

// cocoonRun picks the supervisor of an agent-over-cocoon run and runs the
// preflight of its VMs' networking. Without the CNI plugins (or root) no
// cocoon VM gets a NIC, so no ready guest can answer: the Runner returned
// makes every case inconclusive with the preflight's reason, never a run
// over a silent --nics 0.
func cocoonRun(o Options) (Options, string, *Runner, error) {
	sup, note, err := cocoonSupervisor(o.Supervisor)
	if err != nil {
		return o, "", nil, err
	}
	o.Supervisor = sup
	why, capability := cocoonNetPreflight()
	if why == "" {
		return o, note, nil, nil
	}
	n := need{stack.CNIPackage + " (" + strings.Join(stack.CNIPlugins, ", ") + " in " + stack.CNIPluginDir + ")", reports.MissingBinary}
	if capability {
		n = need{"root", reports.MissingCapability}
	}
	host, _ := os.Hostname()
	return o, note, &Runner{opts: o, skip: "agent over cocoon: " + why, backendNeed: n, supNote: note, res: &reports.Results{RunID: filepath.Base(o.ReportDir), StartedAt: time.Now().UTC(),
		Host: host, Backend: o.Backend, Supervisor: withNote(o.Supervisor, note) + ", agent over cocoon " + o.AgentCocoon, TimeScale: o.Scale, Seed: o.Seed, Regress: o.Regress}}, nil
}

// cocoonSupervisor is realSupervisor's rule for the agent over cocoon: the
// agent's cocoon children enter the case's network and mount namespace by
// the holder's host pid (scenarios/stack cocoonnet.go), which a sandbox's
// pid namespace hides.
func cocoonSupervisor(kind string) (string, string, error) {
	switch kind {
	case injector.KindAuto, "":
		return injector.KindBuiltin, cocoonAutoNote, nil
	case injector.KindBuiltin, injector.KindSystemd:
		return kind, "", nil
	case injector.KindSandbox:
		return "", "", fmt.Errorf("--manager cocoon --supervisor sandbox: cocoon's VMs get their NICs in a network namespace the agent's cocoon children enter by a host pid, which the sandbox's pid namespace hides; use builtin or systemd")
	default:
		return "", "", fmt.Errorf("--supervisor %q: want auto, sandbox, builtin or systemd", kind)
	}
}

// realSupervisor is the supervisor a real-backend run uses for the asked
// kind, and a note when auto chose it. The run's network namespace lives
// under /run/netns and the VMMs need /dev/kvm: the sandbox gives the stack
// private ones, so auto does not try it (nor systemd: one choice, the same
// on every runner), and asking for it is an error.
func realSupervisor(kind string) (string, string, error) {
	switch kind {
	case injector.KindAuto, "":
		return injector.KindBuiltin, realAutoNote, nil
	case injector.KindBuiltin, injector.KindSystemd:
		return kind, "", nil
	case injector.KindSandbox:
		return "", "", fmt.Errorf("--backend real --supervisor sandbox: the sandbox gives the stack a private /run and /dev, so the run's network namespace (/run/netns) and /dev/kvm are out of reach; use builtin or systemd")
	default:
		return "", "", fmt.Errorf("--supervisor %q: want auto, sandbox, builtin or systemd", kind)
	}
}

// Runner runs cases; one per process run (it owns the supervisor).
type Runner struct {
	opts    Options
	skip    string // every case is inconclusive with this reason (real backend unavailable)
	supNote string // why this supervisor, when the backend overrode auto
	run     *stack.Run
	mu      sync.Mutex
	res     *reports.Results
	// narrowest is, per operation window, the narrowest span any
	// calibration of this run measured (see placeFault)
	narrowest map[string]int64

	// snapSkip is the preflight's snapshot reason (realch.ReasonNestedState):
	// every case that needs a snapshot is inconclusive with it
	snapSkip string
	// backendNeed and snapNeed are what skip and snapSkip say is missing,
	// from the preflight's result (results.json not_run)
	backendNeed, snapNeed need
	// mgr is the manager under test of a manager run (nil: the agent stack)
	mgr *mgrRun
}

// New prepares the shared stack parts.
func New(ctx context.Context, o Options) (*Runner, error) {
	if o.Scale <= 0 {
		o.Scale = 1
	}
	if o.Backend == "" {
		o.Backend = "fake"
	}
	if o.Supervisor == "" {
		o.Supervisor = "auto"
	}
	if o.StablePolls <= 0 {
		o.StablePolls = 3
	}
	if o.Manager != "" {
		return newManagerRunner(ctx, o)
	}
	if o.AgentCocoon != "" && o.Backend != "fake" {
		return nil, fmt.Errorf("the agent over cocoon runs on the fake backend only (fakech installed as cloud-hypervisor)")
	}
	supNote, snapSkip := "", ""
	var backendNeed, snapNeed need
	switch o.Backend {
	case "fake":
		if o.AgentCocoon == "" {
			break
		}
		var skipped *Runner
		var err error
		if o, supNote, skipped, err = cocoonRun(o); err != nil || skipped != nil {
			return skipped, err
		}
	case "real":
		sup, note, err := realSupervisor(o.Supervisor)
		if err != nil {
			return nil, err
		}
		o.Supervisor, supNote = sup, note
		// Without KVM or a cloud-hypervisor binary the real-backend specs
		// skip with the preflight's reason (inconclusive, gate exit 2).
		_, pf, err := preflight(realch.Options{})
		snapSkip = pf.Snapshot
		backendNeed = notRunNeed(pf)
		snapNeed = notRunNeed(realch.PreflightResult{Reason: realch.ReasonNestedState})
		skip := ""
		switch {
		case err != nil:
			skip = "real backend unavailable: " + err.Error()
		case !pf.OK:
			skip = "real backend unavailable: " + pf.String()
		}
		if skip != "" {
			host, _ := os.Hostname()
			return &Runner{opts: o, skip: skip, snapSkip: snapSkip, backendNeed: backendNeed, snapNeed: snapNeed, supNote: supNote, res: &reports.Results{RunID: filepath.Base(o.ReportDir), StartedAt: time.Now().UTC(),
				Host: host, Backend: o.Backend, Supervisor: withNote(o.Supervisor, supNote), TimeScale: o.Scale, Seed: o.Seed, Regress: o.Regress}}, nil
		}
	default:
		return nil, fmt.Errorf("--backend %q: want fake or real", o.Backend)
	}
	if err := os.MkdirAll(o.ReportDir, 0o755); err != nil {
		return nil, fmt.Errorf("report dir: %w", err)
	}
	bin, err := binDir()
	if o.BinDir != "" {
		bin, err = o.BinDir, nil
	}
	if err != nil {
		return nil, err
	}
	run, err := newRun(ctx, stack.RunOptions{BinDir: bin, Supervisor: o.Supervisor, Backend: o.Backend, Scale: o.Scale, Seed: o.Seed, StackFS: o.StackFS})
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	r := &Runner{opts: o, run: run, supNote: supNote, snapSkip: snapSkip, snapNeed: snapNeed, res: &reports.Results{
		RunID: filepath.Base(o.ReportDir), StartedAt: time.Now().UTC(), Host: host, Backend: o.Backend,
		Supervisor: withNote(run.Sup.Kind(), supNote), TimeScale: o.Scale, Seed: o.Seed, Regress: o.Regress,
		StackFS: stackFS(run),
	}}
	if o.AgentCocoon != "" {
		// the header says what the agent drove: these are not vmctl's results
		r.res.Supervisor += ", agent over cocoon " + o.AgentCocoon
	}
	return r, nil
}

// withNote is the supervisor as the report's header shows it.
func withNote(kind, note string) string {
	if note == "" {
		return kind
	}
	return kind + " (" + note + ")"
}

// SupervisorNote says why the supervisor is not what auto would have
// picked on the fake backend ("" when it is).
func (r *Runner) SupervisorNote() string { return r.supNote }

// Supervisor is the kind actually used.
func (r *Runner) Supervisor() string {
	if r.run == nil {
		return r.opts.Supervisor
	}
	return r.run.Sup.Kind()
}

// Results is the run so far.
func (r *Runner) Results() *reports.Results {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.res
}

// Close tears down the shared parts.
func (r *Runner) Close() error {
	if r.mgr != nil {
		return r.mgr.close()
	}
	if r.run == nil {
		return nil
	}
	return r.run.Close()
}

// scale multiplies a real-time duration by the run's scale.
func (r *Runner) scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) * r.opts.Scale)
}

// floor keeps a scaled duration above what process start-up costs no matter
// the scale (a fork+exec does not get faster at scale 0.05).
func floor(d, min time.Duration) time.Duration {
	if d < min {
		return min
	}
	return d
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._@-]+`)

// shellWord is p as one shell word: as is when it needs no quoting.
func shellWord(p string) string {
	if !unsafeChars.MatchString(strings.ReplaceAll(p, "/", "")) {
		return p
	}
	return "'" + strings.ReplaceAll(p, "'", `'\''`) + "'"
}

// Repro is the one-line command that reruns a case.
func (r *Runner) Repro(c scenarios.Case) string { return r.repro(c, r.opts.Regress) }

func (r *Runner) repro(c scenarios.Case, bugs []string) string {
	s := "vmchaos repro --scenario " + c.Scenario.ID
	switch {
	case c.HasOff:
		s += " --offset " + injector.FormatOffset(c.Offset)
	case c.HasFrac:
		// not resolved (the case stopped before its window was measured):
		// the fraction, measured again by the repro
		s += " --offset " + scenarios.FormatFrac(c.Frac)
	}
	s += fmt.Sprintf(" --seed %d --time-scale %s --backend %s", r.opts.Seed, strconv.FormatFloat(r.opts.Scale, 'g', -1, 64), r.opts.Backend)
	if r.opts.AgentCocoon != "" {
		// the case ran with its agent over that cocoon: so must its repro
		s += " --manager cocoon --manager-bin " + shellWord(r.opts.AgentCocoon)
	}
	if len(bugs) > 0 {
		s = "VMCHAOS_REGRESS=" + strings.Join(bugs, ",") + " " + s
	}
	return s
}

// RunCase runs one case with the run's regress switches and records it in
// the run's results.
func (r *Runner) RunCase(ctx context.Context, c scenarios.Case) reports.Case {
	return r.RunCaseWith(ctx, c, r.opts.Regress)
}

// RunCaseWith runs one case with these regress switches (selftest).
func (r *Runner) RunCaseWith(ctx context.Context, c scenarios.Case, bugs []string) reports.Case {
	start := time.Now()
	var rc reports.Case
	if skip := r.caseSkip(c.Scenario); skip != "" {
		rc = reports.Case{ID: c.ID, Scenario: c.Scenario.ID, Title: c.Scenario.Title, SeedRef: c.Scenario.SeedRef,
			Labels: c.Labels, Backend: r.opts.Backend, Supervisor: r.opts.Supervisor, TimeScale: r.opts.Scale,
			Seed: r.opts.Seed, Operation: c.Scenario.Op, Fault: faultsString(c.Scenario), ConvergeMs: -1, Attempts: 1,
			StartedAt: time.Now().UTC(), Repro: r.repro(c, bugs), Verdict: reports.Inconclusive, Reason: skip, Culprit: byPrecondition.String()}
	} else if r.opts.Repeat > 1 {
		rc = r.repeatCase(ctx, c, bugs)
	} else {
		rc = r.runCase(ctx, c, bugs, "")
		rc.DurationMs = float64(time.Since(start)) / float64(time.Millisecond)
	}
	if rc.DurationMs == 0 {
		rc.DurationMs = float64(time.Since(start)) / float64(time.Millisecond)
	}
	rc.CoverageKind = scenarios.CoverageKind(c.Scenario)
	if p, k := scenarios.FailpointAction(c.Scenario); k != "" && rc.CoverageKind == k {
		rc.CoverageAt = p
	}
	r.mu.Lock()
	r.res.Cases = append(r.res.Cases, rc)
	if n, ok := r.notRunOf(rc); ok {
		r.res.NotRun = append(r.res.NotRun, n)
	}
	r.mu.Unlock()
	if r.opts.Progress != nil {
		fmt.Fprintln(r.opts.Progress, progressLine(rc))
	}
	if r.opts.Done != nil {
		r.opts.Done(rc)
	}
	return rc
}

func progressLine(rc reports.Case) string {
	s := fmt.Sprintf("%-13s %-48s %6.1fs", strings.ToUpper(rc.Verdict), rc.ID, rc.DurationMs/1000)
	if rc.ConvergeMs >= 0 && rc.Verdict != reports.Inconclusive {
		s += fmt.Sprintf("  converged in %.0fms", rc.ConvergeMs)
		if rc.ConvergeAfterHealMs != nil {
			s += fmt.Sprintf(" (%.0fms after the heal)", *rc.ConvergeAfterHealMs)
		}
	}
	var bad []string
	for _, inv := range rc.Invariants {
		if !inv.OK {
			bad = append(bad, inv.Name)
		}
	}
	if len(bad) > 0 {
		s += "  violated: " + strings.Join(bad, ",")
	}
	if rc.Reason != "" && rc.Verdict != reports.Pass {
		reason := rc.Reason
		if len(reason) > 160 {
			reason = reason[:160] + "…"
		}
		s += "  (" + reason + ")"
	}
	return s
}

// WriteAll writes results.json, junit.xml, report.md and report.html.
func (r *Runner) WriteAll() (*reports.Results, error) {
	r.mu.Lock()
	r.res.FinishedAt = time.Now().UTC()
	if r.mgr == nil { // the matrix is the agent catalogue's
		r.res.Coverage = MatrixCoverage(r.res.Cases, r.notRunnable)
	}
	res := r.res
	r.mu.Unlock()
	return res, reports.WriteAll(r.opts.ReportDir, res)
}

// caseRun is the state of one case in flight.
type caseRun struct {
	r      *Runner
	cl     *cluster // the case's cluster (Env.Nodes >= 2; cluster.go), nil on one node
	c      scenarios.Case
	s      *scenarios.Scenario
	st     *stack.Stack
	rc     *reports.Case
	inj    *injector.Injector
	goals  map[string]string
	gens   map[string]int64
	ledger map[string]int // guest → markers written (cycle count)
	cycles map[string]bool
	kills  []vmmKill // VMM deaths the event stream must report
	direct map[string]*directProc
	// lastDirect is the key in direct of the vmctl the harness started
	// last: the act's verb in flight, sigkill-direct's victim when a park
	// holds the VMM that verb waits on
	lastDirect string
	// starting counts harness vmctls started but not yet in direct;
	// directAdded is closed (and replaced) each time direct changes
	starting    int
	directAdded chan struct{}
	held        []parked // parked points the harness still holds
	faultNs     int64
	healNs      int64      // when the last registry fault healed (heal.go); 0: none timed
	healSeen    chan int64 // watchHeal's answer (heal.go); nil: no watch
	scraper     *checker.Scraper
	victims     map[int]bool
	bugs        []string
	win         *opWindow // the first fault's window as measured (windowed cases)
	refusal     string    // the case was refused before it ran (its window is too short)
	// work: the guest writers (workload.go)
	work *workloads
	// calibIssued: the calibration VMs' first step was issued beside the setup
	calibIssued bool
	// measure measures the window on calibration VMs (measureOn; a test
	// gives its own readings)
	measure func(ctx context.Context, budget time.Duration, vms []string, issued bool) (opWindow, error)
	mark    int   // trace index after arming: the faults count hits from here
	armNs   int64 // when the armed agent was up
	// adoption baseline (Expect.Adopted, adopt.go): every VM listed before
	// the fault (at arm time, and in the park before a parked fault), the
	// first error listing them, and the ready intents' part of it
	preFault map[string]string
	adoptErr error
	adopted  map[string]string
	// unreached: the triggers whose point never came within the budget
	// (stall.go)
	unreached []string
	laps      *laps             // VMCHAOS_LAPS: phase wall times (laps.go)
	clock     *clock            // the alone case's hold on the machine for its timed part (clock.go)
	vArms     map[int]victimArm // faults armed in their victim (invictim.go)
	// macs: per name, the MACs of its VM listed right before its
	// hibernate (Expect.MACKept, macs.go), and the first listing error
	macs    map[string][]string
	macsErr error
	salt    int64
	cut     *cutState     // what a power cut left (power-cut cases)
	acks    []checker.Ack // intent changes the agent acknowledged
	ff      failFast      // the convergence phase's watch for a certain verdict (failfast.go)
	// ledgerHook parks the harness's own ledger writer (ledgerpark.go);
	// nil unless a park trigger names a ledger point
	ledgerHook *ledgerHook
	mu         sync.Mutex
}

type vmmKill struct {
	ID, Name string
	TsNs     int64
}

type directProc struct {
	pid  int // as started: the vmctl, or (sandbox) the nsenter whose child it is
	exit <-chan int
	// self and host are the vmctl's pid as it sees itself and on the host,
	// once known (under caseRun.mu; self 0: not yet, -1: never): kept so that
	// a vmctl that has killed itself, gone from /proc, is still recognised.
	self, host int
}

// repeatCase runs a case Repeat times, each on a fresh stack in its own
// dir, and joins the runs: one verdict when they agree, else flaky.
func (r *Runner) repeatCase(ctx context.Context, c scenarios.Case, bugs []string) reports.Case {
	var runs []reports.Case
	for i := 0; i < r.opts.Repeat && ctx.Err() == nil; i++ {
		t0 := time.Now()
		rc := r.runCase(ctx, c, bugs, fmt.Sprintf(".run%d", i+1))
		rc.DurationMs = float64(time.Since(t0)) / float64(time.Millisecond)
		runs = append(runs, rc)
		if r.opts.Progress != nil {
			fmt.Fprintf(r.opts.Progress, "  run %d/%d %s\n", i+1, r.opts.Repeat, progressLine(rc))
		}
	}
	return reports.JoinRuns(runs)
}

func (r *Runner) runCase(ctx context.Context, c scenarios.Case, bugs []string, runSuffix string) reports.Case {
	if c.Scenario.Mgr != nil {
		if r.mgr == nil {
			return harnessFailed(reports.Case{ID: c.ID, Scenario: c.Scenario.ID, Labels: c.Labels, ConvergeMs: -1},
				errors.New("a manager-verb case needs a manager run (--manager)"))
		}
		return r.runMgrCase(ctx, c, bugs, runSuffix)
	}
	s := c.Scenario
	dirName := c.ID
	if len(bugs) > 0 {
		dirName += "+" + strings.Join(bugs, "+")
	}
	dirName += runSuffix
	caseDir := filepath.Join(r.opts.ReportDir, "cases", unsafeChars.ReplaceAllString(dirName, "_"))
	rc := reports.Case{
		ID: c.ID, Scenario: s.ID, Title: s.Title, SeedRef: s.SeedRef, Labels: c.Labels, Backend: r.opts.Backend,
		Supervisor: r.Supervisor(), TimeScale: r.opts.Scale, Seed: r.opts.Seed, Operation: s.Op,
		Fault: faultsString(s), Trigger: r.triggerString(c, 0), OffsetMs: float64(c.Offset) / float64(time.Millisecond),
		StartedAt: time.Now().UTC(), ConvergeMs: -1, Attempts: 1, Repro: r.repro(c, bugs),
	}
	if err := os.RemoveAll(caseDir); err != nil {
		return harnessFailed(rc, err)
	}
	if err := os.MkdirAll(caseDir, 0o755); err != nil {
		return harnessFailed(rc, err)
	}
	budget := floor(r.scale(orDefault(s.Expect.Budget, 120*time.Second)), 20*time.Second)
	cctx, cancel := context.WithTimeout(ctx, budget+90*time.Second)
	defer cancel()

	lazy, noLazy := lazyStack(s, r.opts.Lazyfs)
	if noLazy != "" {
		rc.Verdict, rc.Reason, rc.Culprit = verdictOf(outcome{Err: preconditionErr(errors.New(noLazy))})
		return rc
	}
	if err := errors.Join(registryPrecondition(s), netPrecondition(s)); err != nil {
		rc.Verdict, rc.Reason, rc.Culprit = verdictOf(outcome{Err: preconditionErr(err)})
		return rc
	}
	lp := newLaps()
	sopts := r.stackOptions(s, caseDir, bugs, lazy)
	var cl *cluster
	if s.Env.Nodes >= 2 {
		var err error
		if cl, err = newCluster(cctx, r.run, s.Env.Nodes, bugs); err != nil {
			return harnessFailed(rc, err)
		}
		sopts.AgentFlags = append(sopts.AgentFlags, cl.agentFlags(cl.names[0])...)
	}
	st, err := r.run.New(cctx, sopts)
	if err != nil {
		if cl != nil {
			_ = cl.close(context.Background())
		}
		return harnessFailed(rc, fmt.Errorf("case stack: %w", err))
	}
	lp.lap("stack")
	cr := &caseRun{r: r, c: c, s: s, st: st, rc: &rc, goals: map[string]string{}, gens: map[string]int64{},
		ledger: map[string]int{}, cycles: map[string]bool{}, direct: map[string]*directProc{}, victims: map[int]bool{}, bugs: bugs, laps: lp,
		clock: &clock{g: ClockGateOf(ctx)}}
	if cl != nil {
		cr.cl = cl
		cl.mu.Lock()
		cl.observe = cr.observeRelease
		cl.mu.Unlock()
		if err := cl.addNodes(cctx, r, st, sopts); err != nil {
			rc.Verdict, rc.Reason, rc.Culprit = verdictOf(outcome{Err: harnessErr(fmt.Errorf("cluster: %w", err)), TeardownErr: cr.teardown(caseDir)})
			return rc
		}
	}
	iopts := injector.Options{CtlDir: st.CtlDir}
	if st.RegistryDisk != nil {
		iopts.Disk = st.RegistryDisk // never a typed nil in the interface
	}
	if st.Net != nil {
		iopts.Link = st.Net
	}
	cr.inj = injector.New(r.run.Sup, st.Trace, iopts)
	var o outcome
	if err := cr.netAvailable(); err != nil {
		o = outcome{Err: preconditionErr(err)}
	} else {
		o = cr.execute(cctx, budget)
	}
	if o.Err == nil && errors.Is(ctx.Err(), context.Canceled) {
		// the run was interrupted mid-case: what the phases saw after
		// that (sources cut off, a converge cut short) is no evidence
		o.Err = harnessErr(fmt.Errorf("run interrupted: %w", ctx.Err()))
	}
	o.TeardownErr = cr.teardown(caseDir)
	cr.judge(o)
	lp.lap("judge")
	lp.flush(c.ID)
	return rc
}

// stackOptions is the node stack a scenario needs.
func (r *Runner) stackOptions(s *scenarios.Scenario, caseDir string, bugs []string, lazy stack.LazyMount) stack.Options {
	o := stack.Options{CaseDir: caseDir, RestartDelay: r.scale(orDefault(s.Env.RestartDelay, 5*time.Second)),
		AgentFlags: r.agentFlags(s), Daemon: s.Env.Daemon, DaemonEvery: r.scale(s.Env.DaemonEvery), Regress: bugs,
		Lazy: lazy, OCIRegistry: s.Env.Registry == scenarios.RegistryOCI,
		RegistryDisk: hasFault(s, injector.FaultRegistryStorageFull), NetPath: hasNetFault(s), NetMode: s.Env.NetMode,
		FakeCHTiming: s.Env.FakeCHTiming}
	if r.opts.AgentCocoon != "" {
		o.Cocoon = &stack.CocoonOptions{Bin: r.opts.AgentCocoon}
	}
	return o
}

// teardown stops what the case started and closes its stack, then fills in
// the record's logs, timeline and workload. Teardown is part of the verdict:
// a case that leaves processes behind is a harness error (the error returned).
func (cr *caseRun) teardown(caseDir string) error {
	cr.stopWorkloads()
	if cr.scraper != nil {
		cr.scraper.Stop()
	}
	cr.releaseAll()
	if cr.ledgerHook != nil {
		_ = cr.ledgerHook.conn.Close()
	}
	tctx, tcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer tcancel()
	if cr.cl != nil {
		cr.cl.stopWatching()
	}
	cr.laps.lap("teardown-pre")
	var closeErr error
	if cr.cl != nil {
		// the other nodes first: they may run in the case's own net
		// path, which its stack's Close removes
		closeErr = cr.cl.closeNodes(tctx)
	}
	closeErr = errors.Join(closeErr, cr.st.Close(tctx))
	cr.laps.lap("close")
	if cr.cl != nil {
		closeErr = errors.Join(closeErr, cr.cl.close(tctx))
	}
	rc := cr.rc
	rc.Logs = stack.LogRel(caseDir)
	for k, v := range rc.Logs {
		rc.Logs[k] = filepath.Join("cases", filepath.Base(caseDir), v)
	}
	rc.Timeline = timeline(cr.st.Trace.Sorted(), rc.Injections, rc.ConvergeMs, cr.faultNs)
	if cr.healNs > 0 {
		rc.Timeline = withHeal(rc.Timeline, cr.healNs)
	}
	rc.Workload = cr.workloadReport()
	return closeErr
}

// harnessFailed is a case the harness could not even set up: error.
func harnessFailed(rc reports.Case, err error) reports.Case {
	rc.Verdict, rc.Reason, rc.Culprit = verdictOf(outcome{Err: harnessErr(err)})
	return rc
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// agentFlags are the scenario's extra nodeagent flags, passed as written:
// the agent scales its own durations by VMCHAOS_TIME_SCALE.
func (r *Runner) agentFlags(s *scenarios.Scenario) []string {
	return append([]string(nil), s.Env.AgentFlags...)
}

func faultsString(s *scenarios.Scenario) string {
	var parts []string
	for _, f := range s.Faults {
		p := f.Kind
		if f.Child != "" {
			p += "(" + f.Child + ")"
		}
		if f.Kind == "stop" && f.StopFor > 0 {
			p += " for " + f.StopFor.String()
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " + ")
}

// triggerString is fault i's trigger as the injector parses it, with the
// case's scaled offset on the first fault.
func (r *Runner) triggerString(c scenarios.Case, i int) string {
	f := c.Scenario.Faults[i]
	t := f.Trigger
	if t == "" || t == "now" || f.Kind == "none" {
		if t == "now" && c.HasOff {
			return "now + " + injector.FormatOffset(r.scale(c.Offset))
		}
		return t
	}
	if f.VM != "" && f.Kind != "sigkill-vmm" && !strings.Contains(t, "@vm=") {
		t += "@vm=" + f.VM
	}
	if strings.HasPrefix(t, "park ") {
		return t
	}
	off := time.Duration(0)
	if i == 0 || sameTrigger(c.Scenario, i) {
		off = r.scale(c.Offset)
	}
	return t + " + " + injector.FormatOffset(off.Round(time.Microsecond))
}

// sameTrigger: a later fault sharing the first fault's trigger shares its offset.
func sameTrigger(s *scenarios.Scenario, i int) bool {
	return s.Faults[i].Trigger == s.Faults[0].Trigger
}

// stackFS is what results.json says the run's stacks lived on.
func stackFS(run *stack.Run) string {
	if run.TmpFS {
		return stack.StackFSTmpfs
	}
	return stack.StackFSDisk
}

// StackFS is where the run's stacks live (tmpfs or disk); "" for a run
// that made no stack (a skipped real backend).
func (r *Runner) StackFS() string { return r.res.StackFS }

// RepeatRuns is how many times each case runs (--repeat; at least 1).
func (r *Runner) RepeatRuns() int { return max(r.opts.Repeat, 1) }
