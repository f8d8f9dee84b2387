package managerlayer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/fakech/guestimg"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/manager/cocoon"
	mvmctl "github.com/vmchaos/vmchaos/manager/vmctl"
	"github.com/vmchaos/vmchaos/reports"
)

// Managers the layer has adapters for.
var Managers = []string{"vmctl", "cocoon"}

// EnvCaseTag is the variable every process of a case inherits (verbs, the
// VMMs they launch, the event stream), so teardown finds them by /proc scan.
const EnvCaseTag = "VMCHAOS_MANAGER_CASE"

// Options configure a manager-layer run.
type Options struct {
	Manager   string  // vmctl | cocoon
	Bin       string  // the manager binary ("" for vmctl: BinDir/vmctl)
	Config    string  // the manager's own config file (--manager-config)
	BinDir    string  // stack binaries: fakech installed as cloud-hypervisor
	Scale     float64 // VMCHAOS_TIME_SCALE of fakech (and vmctl)
	Seed      int64
	ReportDir string
	Progress  io.Writer
}

// Runner runs manager-layer cases one after the other.
type Runner struct {
	opts   Options
	tmp    string
	image  string
	reaper *reaper
	mu     sync.Mutex
	n      int
}

// NewManager returns the adapter of name for a store under dir.
func NewManager(name string, o manager.Options) (manager.Manager, error) {
	switch name {
	case "vmctl":
		return mvmctl.New(o), nil
	case "cocoon":
		if o.Bin == "" {
			return nil, errors.New("manager cocoon: --manager-bin is required (vmchaos never builds or fetches cocoon)")
		}
		return cocoon.New(o), nil
	}
	return nil, fmt.Errorf("manager %q: want one of %s", name, strings.Join(Managers, ", "))
}

// New checks the binaries, builds the fake guest image and becomes the
// subreaper of the VMMs the cases launch.
func New(o Options) (*Runner, error) {
	if o.Bin == "" && o.Manager == "vmctl" {
		o.Bin = filepath.Join(o.BinDir, "vmctl")
	}
	if _, err := NewManager(o.Manager, manager.Options{Bin: o.Bin}); err != nil {
		return nil, err
	}
	if st, err := os.Stat(o.Bin); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("manager binary %q: not an executable file (%v)", o.Bin, err)
	}
	vmm := filepath.Join(o.BinDir, cocoon.VMMName)
	if _, err := os.Stat(vmm); err != nil {
		return nil, fmt.Errorf("fakech as %s: %w", vmm, err)
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if killed, err := cleanLeftovers(); err != nil {
		return nil, err
	} else if len(killed) > 0 {
		fmt.Fprintf(o.Progress, "killed %d process(es) left by a manager-layer run whose runner died: %s\n", len(killed), strings.Join(killed, "; "))
	}
	tmp, err := os.MkdirTemp("", "vmchaos-mgr-")
	if err != nil {
		return nil, fmt.Errorf("managerlayer: %w", err)
	}
	if err := writeOwner(tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, fmt.Errorf("managerlayer: %w", err)
	}
	r := &Runner{opts: o, tmp: tmp, image: filepath.Join(tmp, "guest.img")}
	if _, err := guestimg.Build(r.image, guestimg.Options{Hostname: "vmchaos-guest"}); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, fmt.Errorf("managerlayer: guest image: %w", err)
	}
	if r.reaper, err = startReaper(cocoon.VMMName); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, err
	}
	return r, nil
}

// Cases expands the catalogue for the runner's manager, after discovering
// the VMM phases each of its verbs passes through.
func (r *Runner) Cases(ctx context.Context) ([]Case, error) {
	m, err := NewManager(r.opts.Manager, manager.Options{Bin: r.opts.Bin, Dir: r.tmp, VMMDir: r.opts.BinDir})
	if err != nil {
		return nil, err
	}
	phases, err := r.discover(ctx, m)
	if err != nil {
		return nil, err
	}
	return Expand(m, phases), nil
}

// Close stops the reaper and removes the run's temp dir.
func (r *Runner) Close() error {
	r.reaper.Close()
	return os.RemoveAll(r.tmp)
}

// Repro is the one-line command that runs c again.
func (r *Runner) Repro(c Case) string {
	s := fmt.Sprintf("vmchaos run --manager %s", r.opts.Manager)
	if r.opts.Manager != "vmctl" {
		s += " --manager-bin " + r.opts.Bin
	}
	if r.opts.Config != "" {
		s += " --manager-config " + r.opts.Config
	}
	return s + fmt.Sprintf(" --time-scale %g --seed %d --label-filter 'case:%s'", r.opts.Scale, r.opts.Seed, caseLabel(c.ID))
}

// Run runs the cases one after the other without Ginkgo and returns the
// results (not yet written).
func (r *Runner) Run(ctx context.Context, cases []Case, filter string) *reports.Results {
	res := r.newResults(filter)
	for _, c := range cases {
		if ctx.Err() != nil {
			break
		}
		rc := r.RunCase(ctx, c)
		r.progress(rc)
		res.Cases = append(res.Cases, rc)
	}
	res.FinishedAt = time.Now().UTC()
	return res
}

func (r *Runner) newResults(filter string) *reports.Results {
	host, _ := os.Hostname()
	return &reports.Results{RunID: filepath.Base(r.opts.ReportDir), StartedAt: time.Now().UTC(), Host: host,
		Backend: "fake", Supervisor: "none (manager layer: " + r.opts.Manager + ")", TimeScale: r.opts.Scale,
		Seed: r.opts.Seed, Filter: filter}
}

// progress prints one line per finished case.
func (r *Runner) progress(rc reports.Case) {
	fmt.Fprintf(r.opts.Progress, "%-13s %s (%s)%s\n", strings.ToUpper(rc.Verdict), rc.ID, time.Duration(rc.DurationMs*float64(time.Millisecond)).Round(time.Millisecond), reasonSuffix(rc))
}

func reasonSuffix(c reports.Case) string {
	if c.Verdict == reports.Pass {
		return ""
	}
	var bad []string
	for _, inv := range c.Invariants {
		if !inv.OK {
			bad = append(bad, inv.Name)
		}
	}
	if len(bad) > 0 {
		return ": " + strings.Join(bad, ", ")
	}
	return ": " + c.Reason
}

// caseRun is the state of one case while it runs.
type caseRun struct {
	r       *Runner
	c       Case
	m       manager.Manager
	dir     string // temp dir (store, sockets)
	caseDir string // report dir of the case
	ctl     string
	tag     string
	trace   *injector.Trace
	seq     int
	events  *eventStream
	out     reports.Case
	// timeline holds the verbs the runner started; the VMM phases, the
	// fault and the convergence are added at the end.
	timeline []reports.TimelineEvent
	phases   []failpoint.Event // the trace, kept at teardown
}

// RunCase runs one case end to end and tears it down.
func (r *Runner) RunCase(ctx context.Context, c Case) reports.Case {
	r.mu.Lock()
	r.n++
	n := r.n
	r.mu.Unlock()
	start := time.Now()
	cr := &caseRun{r: r, c: c, dir: filepath.Join(r.tmp, fmt.Sprintf("m%d", n)),
		caseDir: filepath.Join(r.opts.ReportDir, "cases", c.ID)}
	cr.out = reports.Case{ID: c.ID, Scenario: c.ID, Title: c.Title, Labels: c.Labels, Backend: "fake",
		Supervisor: "none", TimeScale: r.opts.Scale, Seed: r.opts.Seed, Operation: string(c.Op.Verb),
		StartedAt: start.UTC(), Attempts: 1, Repro: r.Repro(c), ConvergeMs: -1}
	cr.tag = EnvCaseTag + "=" + cr.dir
	verdict, reason := cr.run(ctx)
	if err := cr.teardown(); err != nil {
		if verdict != reports.Fail {
			verdict, reason = reports.Error, err.Error()
		} else {
			reason += "; " + err.Error()
		}
	}
	cr.out.Verdict, cr.out.Reason = verdict, reason
	cr.out.DurationMs = float64(time.Since(start)) / float64(time.Millisecond)
	cr.out.Logs = logFiles(r.opts.ReportDir, cr.caseDir)
	cr.out.Timeline = cr.buildTimeline()
	return cr.out
}

// run sets the case up, injects, recovers and judges; it returns the verdict
// and, for anything but a judged pass or fail, why.
func (cr *caseRun) run(ctx context.Context) (string, string) {
	c := cr.c
	if verdict, why := cr.prepare(ctx); verdict != "" {
		return verdict, why
	}
	var err error
	var window time.Duration
	if c.Trigger == TrigOffset {
		// The shortest of three runs: a load hiccup in one would stretch
		// every offset past the end of the real run.
		for i := 0; i < 3; i++ {
			for _, call := range c.Op.Calibrate {
				call = calibName(call, i)
				res := cr.verb(ctx, call)
				if res.err != nil {
					return reports.Inconclusive, "calibration: " + res.String()
				}
				if call.Verb == c.Op.Verb && (window == 0 || res.dur < window) {
					window = res.dur
				}
			}
		}
		if window <= 0 {
			return reports.Error, "calibration did not run " + string(c.Op.Verb)
		}
		_ = os.WriteFile(filepath.Join(cr.caseDir, "window.txt"), []byte(fmt.Sprintf("window %s (measured: unarmed %s on this case's store), offset %.0f%% = %s\n",
			window, c.Op.Verb, c.Fraction*100, time.Duration(float64(window)*c.Fraction))), 0o644)
	}
	if cr.events, err = cr.startEvents(); err != nil {
		return reports.Inconclusive, "event stream: " + err.Error()
	}
	inj, landedOK, why := cr.inject(ctx, window)
	cr.out.Injections = []reports.Injection{inj}
	cr.out.Fault, cr.out.Trigger, cr.out.LandedPhase = inj.Fault, inj.Trigger, inj.LastPhase
	if !landedOK {
		return reports.Inconclusive, why
	}
	var history []reports.Invariant
	if c.Trigger == TrigKillVMM {
		history = append(history, cr.deathSeen(ctx, inj.ActualNs))
	}
	history = append(history, cr.recover(ctx)...)
	invs, convergedNs := cr.converge(ctx)
	if convergedNs > 0 {
		cr.out.ConvergeMs = float64(convergedNs-inj.ActualNs) / 1e6
	}
	invs = append(invs, cr.streamMatches(ctx))
	cr.out.Invariants = append(append([]reports.Invariant{{Name: "fault-landed", OK: true,
		Evidence: fmt.Sprintf("%s %s, VMM's last phase %q", inj.Fault, inj.Trigger, inj.LastPhase)}}, history...), invs...)
	for _, inv := range cr.out.Invariants {
		if !inv.OK {
			return reports.Fail, ""
		}
	}
	return reports.Pass, ""
}

// prepare makes the case's store: dirs, trace, the adapter with the case's
// environment, its Setup and the fixture (src running, base saved, the
// op's own fixture). A non-empty verdict ends the case.
func (cr *caseRun) prepare(ctx context.Context) (string, string) {
	c := cr.c
	cr.ctl = filepath.Join(cr.dir, "ctl")
	for _, d := range []string{cr.dir, cr.ctl, filepath.Join(cr.caseDir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return reports.Error, err.Error()
		}
	}
	var err error
	if cr.trace, err = injector.ListenTrace(filepath.Join(cr.dir, "t.sock")); err != nil {
		return reports.Error, err.Error()
	}
	env := []string{cr.tag,
		"VMCHAOS_TIME_SCALE=" + strconv.FormatFloat(cr.r.opts.Scale, 'g', -1, 64),
		"FAKECH_JITTER_SEED=" + strconv.FormatInt(cr.r.opts.Seed, 10),
		failpoint.EnvTrace + "=" + cr.trace.Path(),
		failpoint.EnvCtl + "=" + cr.ctl,
	}
	if c.Trigger == TrigPark {
		// Every VMM of the case is born with the pause armed (the fixture's
		// VMM is the one a save or rm talks to), and passes straight
		// through while the release file exists: the harness removes it
		// only for the verb under test.
		env = append(env, failpoint.EnvFailpoints+"="+c.Point+"=pause")
		if err := cr.releasePark(); err != nil {
			return reports.Error, err.Error()
		}
	}
	cr.m, err = NewManager(cr.r.opts.Manager, manager.Options{Bin: cr.r.opts.Bin, Config: cr.r.opts.Config,
		Dir: cr.dir, VMMDir: cr.r.opts.BinDir, Image: cr.r.image, Env: env})
	if err != nil {
		return reports.Error, err.Error()
	}
	if err := cr.m.Setup(ctx); err != nil {
		return reports.Inconclusive, "setup: " + err.Error()
	}
	fixture := []manager.Call{{Verb: manager.VerbCreate, Name: SrcVM}, {Verb: manager.VerbSnapshotSave, VM: SrcVM, Name: BaseSnap}}
	for _, call := range append(fixture, c.Op.Fixture...) {
		if res := cr.verb(ctx, call); res.err != nil {
			return reports.Inconclusive, "fixture: " + res.String()
		}
	}
	return "", ""
}

// calibName gives the i-th calibration run its own object names.
func calibName(c manager.Call, i int) manager.Call {
	for _, p := range []*string{&c.VM, &c.Name} {
		if *p == "calib" {
			*p = fmt.Sprintf("calib-%d", i)
		}
	}
	return c
}

// buildTimeline merges the verbs, the VMM phases of the trace, the fault
// and the convergence, in time order.
func (cr *caseRun) buildTimeline() []reports.TimelineEvent {
	tl := append([]reports.TimelineEvent(nil), cr.timeline...)
	for _, e := range cr.phases {
		tl = append(tl, reports.TimelineEvent{TsNs: e.TsNs, Kind: "phase", Proc: e.Proc, Point: e.Point, VM: e.VM})
	}
	for _, inj := range cr.out.Injections {
		if inj.ActualNs > 0 {
			tl = append(tl, reports.TimelineEvent{TsNs: inj.ActualNs, Kind: "fault", Note: inj.Fault + " " + inj.Trigger})
		}
	}
	if cr.out.ConvergeMs >= 0 && len(cr.out.Injections) > 0 {
		ns := cr.out.Injections[0].ActualNs + int64(cr.out.ConvergeMs*1e6)
		tl = append(tl, reports.TimelineEvent{TsNs: ns, Kind: "converged"})
	}
	sort.SliceStable(tl, func(i, j int) bool { return tl[i].TsNs < tl[j].TsNs })
	return tl
}

// releasePark lets every hit of the armed point pass.
func (cr *caseRun) releasePark() error {
	return os.WriteFile(filepath.Join(cr.ctl, cr.c.Point+".release"), nil, 0o644)
}

// verbResult is one finished verb.
type verbResult struct {
	call  manager.Call
	argv  []string
	code  int // -1: killed by a signal
	err   error
	dur   time.Duration
	log   string
	tail  string
	start int64
}

func (v verbResult) String() string {
	if v.err == nil {
		return fmt.Sprintf("%s: ok in %s", v.call, v.dur.Round(time.Millisecond))
	}
	return fmt.Sprintf("%s: %v: %s", v.call, v.err, v.tail)
}

// running is a verb the runner started; exit delivers its exit code once
// (-1 when a signal killed it).
type running struct {
	cmd  *exec.Cmd
	log  string
	exit chan int
}

// startVerb starts a verb as a child of the runner, logging into the case's
// logs dir.
func (cr *caseRun) startVerb(call manager.Call) (*running, error) {
	argv, err := cr.m.Command(call)
	if err != nil {
		return nil, err
	}
	cr.seq++
	logPath := filepath.Join(cr.caseDir, "logs", fmt.Sprintf("%02d-%s.log", cr.seq, call.Verb))
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "$ %s\n", strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = cr.m.Env()
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", call, err)
	}
	cr.timeline = append(cr.timeline, reports.TimelineEvent{TsNs: failpoint.Now(), Kind: "phase", Proc: cr.m.Name(),
		Point: string(call.Verb), Note: strings.Join(argv[1:], " ")})
	rv := &running{cmd: cmd, log: logPath, exit: make(chan int, 1)}
	go func() {
		err := cmd.Wait()
		f.Close()
		code := 0
		if err != nil {
			code = -1
			var ee *exec.ExitError
			if errors.As(err, &ee) && ee.ExitCode() >= 0 {
				code = ee.ExitCode()
			}
		}
		rv.exit <- code
	}()
	return rv, nil
}

// verb runs a call to completion (bounded).
func (cr *caseRun) verb(ctx context.Context, call manager.Call) verbResult {
	res := verbResult{call: call, start: failpoint.Now()}
	t0 := time.Now()
	rv, err := cr.startVerb(call)
	if err != nil {
		res.err = err
		return res
	}
	res.argv, res.log = rv.cmd.Args, rv.log
	code, err := rv.wait(ctx, 2*time.Minute)
	res.dur, res.code = time.Since(t0), code
	if err != nil {
		res.err = err
	} else if code != 0 {
		res.err = fmt.Errorf("exit %d", code)
	}
	if res.err != nil {
		res.tail = logTail(rv.log, 3)
	}
	return res
}

// wait waits for the verb's exit, killing it after limit.
func (rv *running) wait(ctx context.Context, limit time.Duration) (int, error) {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case code := <-rv.exit:
		rv.exit <- code // keep it readable for a second wait
		return code, nil
	case <-ctx.Done():
	case <-t.C:
	}
	_ = rv.cmd.Process.Kill()
	return -1, fmt.Errorf("%s: no exit after %s", strings.Join(rv.cmd.Args, " "), limit)
}

// ansi matches terminal colour sequences (cocoon colours its log lines
// even into a file).
var ansi = regexp.MustCompile("\x1b\\[[0-9;]*m")

// logTail is what a failed verb said: its last "Error" line when it
// printed one (cocoon logs every step before it), else its last n lines.
func logTail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(ansi.ReplaceAllString(string(b), "")), "\n")
	if len(lines) > 1 && strings.HasPrefix(lines[0], "$ ") {
		lines = lines[1:] // the command line, already in the call
	}
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "Error") {
			return lines[i]
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// logFiles maps the case's files to paths relative to the run dir.
func logFiles(runDir, caseDir string) map[string]string {
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

// BinPath is the manager binary the run uses.
func (r *Runner) BinPath() string { return r.opts.Bin }
