package scenarios

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
)

// The coverage cases (issue #31 item 5: nightly reaches 100 % of the
// coverage denominator): after the hand-written catalogue, the park and
// power-cut cases and the matrix, every cell of the denominator
// (CoverageCells) that no case targets by construction gets a nightly case
// of its own: a park at the point with that fault kind, or the failpoint
// action at the point, in the cell's operation context. "Targets by
// construction" is what a case's definition says: a park's point or a
// failpoint action's point, with its coverage kind, in its operation (or
// the operation a landing there falls back to); a timed fault's landing
// phase is known only once it ran, so it never counts here.
//
// A cell gets no case when no shape below can reach it alone; CoverageGaps
// names each such cell with the reason, so a gap is said, never dropped.

// covOnce is the once= token of a coverage case's failpoint action: the
// first process that hits the point claims it, a restarted agent or the
// next vmctl child goes on unharmed (failpoint.OnceClaimFile).
const covOnce = "cov"

// covActions are the failpoint actions of the failpoint coverage kinds.
var covActions = map[string]string{
	CovFailpointKill:  "kill(once=" + covOnce + ")",
	CovFailpointExit:  "exit(3,once=" + covOnce + ")",
	CovFailpointError: "error(vmchaos coverage: injected error,once=" + covOnce + ")",
}

// covOps are the operation contexts a generated case can drive: the
// agent operations of the matrix (its Act is known: matrixScenario's).
func covOps() map[string]bool {
	out := map[string]bool{}
	for _, mo := range MatrixOps {
		out[mo.Op] = true
	}
	return out
}

// CoverageGap is a cell of the denominator no case of the catalogue
// targets, with why no generated case does either.
type CoverageGap struct {
	Cell CoverageCell
	Why  string
}

// coverGen is the generated coverage cases and the gaps left, built once
// from the catalogue as the other init functions left it.
type coverGen struct {
	scenarios []Scenario
	gaps      []CoverageGap
}

var coverageGen coverGen

// CoverageGaps lists the cells no catalogue case targets (generated
// coverage cases included), each with its reason.
func CoverageGaps() []CoverageGap { return append([]CoverageGap(nil), coverageGen.gaps...) }

// cellKeyS keys the denominator by (op, point, kind).
type cellKeyS struct{ Op, Point, Kind string }

// coverTargets is every cell some case of cat targets by construction.
func coverTargets(cat []Scenario) map[cellKeyS]bool {
	cells := map[cellKeyS]bool{}
	for _, c := range CoverageCells() {
		cells[cellKeyS{c.Op, c.Point, c.Kind}] = true
	}
	fallback := CoverageFallbackOps()
	out := map[cellKeyS]bool{}
	for i := range cat {
		s := &cat[i]
		kind := CoverageKind(s)
		point := targetPoint(s, kind)
		if kind == "" || point == "" {
			continue
		}
		for _, op := range append(append([]string{s.Op}, fallback[s.Op]...), fallback[""]...) {
			if k := (cellKeyS{op, point, kind}); cells[k] {
				out[k] = true
				break
			}
		}
	}
	return out
}

// targetPoint is the point s's first fault targets by construction: a
// park's point, a failpoint action's own point ("" otherwise).
func targetPoint(s *Scenario, kind string) string {
	if len(s.Faults) == 0 {
		return ""
	}
	if t := s.Faults[0].Trigger; strings.HasPrefix(t, "park ") {
		p, _, _ := strings.Cut(strings.TrimPrefix(t, "park "), "@")
		p, _, _ = strings.Cut(p, "#")
		return strings.TrimSpace(p)
	}
	if strings.HasPrefix(kind, "failpoint-") {
		p, _ := FailpointAction(s)
		return p
	}
	return ""
}

// buildCoverageCases generates a case for every cell cat does not target
// and lists the cells no shape reaches.
func buildCoverageCases(cat []Scenario) coverGen {
	var g coverGen
	targeted := coverTargets(cat)
	ops := covOps()
	ids := map[string]bool{}
	for i := range cat {
		ids[cat[i].ID] = true
	}
	for _, c := range CoverageCells() {
		if targeted[cellKeyS{c.Op, c.Point, c.Kind}] {
			continue
		}
		if !ops[c.Op] && directVerbs[c.Op].Act == nil && viaOp[c.Point].Op == "" && c.Op != "daemon" && c.Op != OpMigrate && c.Op != "ledger" &&
			!StartupPoints[c.Point] {
			g.gaps = append(g.gaps, CoverageGap{c, noShape(c.Op)})
			continue
		}
		s, why := coverageScenario(c)
		if why != "" {
			g.gaps = append(g.gaps, CoverageGap{c, why})
			continue
		}
		if ids[s.ID] {
			g.gaps = append(g.gaps, CoverageGap{c, "id " + s.ID + " taken by a catalogue case that targets another cell"})
			continue
		}
		ids[s.ID] = true
		g.scenarios = append(g.scenarios, s)
	}
	sort.SliceStable(g.gaps, func(i, j int) bool { return g.gaps[i].Why < g.gaps[j].Why })
	return g
}

// coverageScenario is the case of one cell of an agent operation's
// context, or why there is none. A VMM point of a save or hibernate needs
// the VMM started by the armed stack (armedHibernate), whose create hits
// the create's VMM points first: there neither a park nor a one-shot
// action singles out the save's hit.
func coverageScenario(c CoverageCell) (Scenario, string) {
	if c.Kind == CovFailpointError && c.Point == "ch.eject.acked" {
		return ejectRefusedScenario(c)
	}
	if directVerbs[c.Op].Act != nil {
		return directVerbScenario(c)
	}
	if c.Op == "daemon" {
		return daemonScenario(c)
	}
	if c.Op == OpMigrate {
		return migrateCoverScenario(c)
	}
	if c.Op == "ledger" {
		return ledgerScenario(c)
	}
	if c.Op == "agent" && StartupPoints[c.Point] {
		return startupScenario(c)
	}
	if v := viaOp[c.Point]; v.Op != "" && !covOps()[c.Op] {
		return viaOpScenario(c, v)
	}
	if c.Kind == FaultSigkillDirect {
		return directSaveScenario(c)
	}
	armed := c.Proc == "fakech" && (c.Op == OpSave || c.Op == OpHibernate)
	nth := ""
	if armed && createHits(c.Point) {
		// the armed act's create passes the point once first, in the
		// same VMM (the act's only one): the operation's hit is that
		// VMM's second (park POINT#2; the action's rule behind a 1*
		// pass-through)
		nth = "#2"
	}
	if mk, ok := matrixKindNamed(c.Kind); ok && (nth != "" || asyncAt(c.Op, c.Point)) {
		// the matrix leaves these to the coverage cases: a hit the
		// create passes first, or an eject point (fakech tells the guest
		// once the request's phases are passed, so a park holds its ack)
		return matrixShapeScenario(c, mk, nth), ""
	}
	s := Scenario{
		ID:      "cov-" + c.Op + "-" + strings.ReplaceAll(c.Point, ".", "-") + "-" + c.Kind,
		SeedRef: "coverage", Op: c.Op, Speed: "nightly",
		Env:    Env{RestartDelay: 1 * time.Second},
		Labels: []string{"coverage", "point:" + c.Point, "kind:" + c.Kind},
	}
	killsVMM := false
	switch {
	case covActions[c.Kind] != "":
		s.Title = fmt.Sprintf("failpoint action %s at %s during %s", covActions[c.Kind], c.Point, c.Op)
		s.Env.Failpoints = c.Point + "=" + covActions[c.Kind]
		if nth != "" {
			s.Env.Failpoints = c.Point + "=1*sleep(0);" + s.Env.Failpoints
		}
		s.Faults = []Fault{{Kind: "failpoint", Trigger: "at " + c.Point + nth, Window: [2]string{c.Point, opDone[c.Op]}}}
		s.Labels = append(s.Labels, "trigger:at")
		// the process that hits the point is gone: a VMM's guest RAM
		// with it
		killsVMM = c.Proc == "fakech" && c.Kind != CovFailpointError
	case c.Kind == FaultPowerCut:
		s.Title = fmt.Sprintf("power cut while parked at %s during %s", c.Point, c.Op)
		s.Faults = []Fault{{Kind: FaultPowerCut, Trigger: "park " + c.Point + nth}}
		// as packaged: the unit starts again 5 s (scaled) after the boot
		s.Env.RestartDelay = 5 * time.Second
		s.Labels = append(s.Labels, "trigger:park")
	default:
		return Scenario{}, "a matrix kind the matrix's own rules leave out here (park-hit-earlier, vmm-moves-on-async); no one-shot shape for it yet"
	}
	if c.Proc == "nodeagent" && c.Kind == FaultPowerCut {
		s.Faults[0].VM = vmA
	}
	s.Setup, s.Act = opSteps(c.Op, armed)
	s.Expect.Ledger = c.Op != OpCreate && c.Op != OpDelete && !killsVMM
	return s, ""
}

// opSteps is the setup and act of an agent operation's case (the
// matrix's): armed, the act creates the VM before it hibernates it.
func opSteps(op string, armed bool) (setup, act []Step) {
	switch {
	case op == OpCreate:
		return nil, []Step{{Kind: StepCreate, VM: vmA}}
	case op == OpWake:
		return hibernated, []Step{{Kind: StepWake, VM: vmA}}
	case op == OpDelete:
		return []Step{createA}, []Step{{Kind: StepDelete, VM: vmA}}
	case armed:
		return nil, armedHibernate
	}
	return readyA, []Step{{Kind: StepHibernate, VM: vmA}}
}

// matrixShapeScenario is a matrix kind in the matrix's own case shape at
// a cell its rules leave out: parked at hit nth of a VMM point the armed
// act's create passes first (the save's ch.resume; park-hit-earlier), or
// at an eject point of the hibernate (vmm-moves-on-async).
func matrixShapeScenario(c CoverageCell, mk MatrixKind, nth string) Scenario {
	var cell matrixCell
	for _, mc := range matrixCells() {
		if mc.Op == c.Op && mc.Point.Name == c.Point && mc.Kind.Name == mk.Name {
			cell = mc
		}
	}
	s := matrixScenario(cell, "nightly")
	s.Faults[0].Trigger += nth
	s.ID = "cov-" + c.Op + "-" + strings.ReplaceAll(c.Point, ".", "-") + "-" + c.Kind
	s.SeedRef = "coverage"
	s.Title = fmt.Sprintf("%s while parked at %s during %s (the guest's eject ack held)", mk.Name, c.Point, c.Op)
	if nth != "" {
		s.Title = fmt.Sprintf("%s while parked at the %s's own hit of %s (the create's passed)", mk.Name, c.Op, c.Point)
	}
	// the matrix's labels are matrix, trigger:park, point, kind[, double]
	s.Labels = append([]string{"coverage", "point:" + c.Point, "kind:" + c.Kind, "trigger:park"}, s.Labels[4:]...)
	return s
}

// noShape is why a cell of a context no generated shape drives gets no
// case: every context has one today (TestCoverageNoGaps), so this names a
// context added to the denominator without its shape.
func noShape(op string) string {
	return "no generated shape drives the " + op + " context yet: a cell of it needs a case (coverage_cases.go) or a rule that takes it out of the denominator with its reason (coverage.go)"
}

// directVM is the VM a coverage case's harness-run verbs act on.
const directVM = "direct-x"

// vmctlStep is a harness-run `vmctl ARGS` (waited for when wait).
func vmctlStep(wait bool, args ...string) Step {
	return Step{Kind: StepDirectVmctl, VM: directVM, Wait: wait, Args: args}
}

// directClone is the harness's own `vm clone` of the base image.
var directClone = vmctlStep(true, "vm", "clone", "--name", directVM, "base")

// directVerbs are the manager verbs run by themselves: what the unarmed
// setup prepares and what the armed act runs (its last step, the verb under
// test, not waited for). A VMM point parks only in a VMM the armed stack
// started: stop, rm and net clone their VM in the act (the clone hits none
// of their points), start stops it in the setup and boots a new VMM. Every
// setup first brings up an agent VM (createA): a bystander whose intent goal
// is the positive evidence intent-goal needs (issue 31 item 2), while the
// store invariants judge what the killed verb left.
var directVerbs = map[string]struct{ Setup, Act []Step }{
	OpClone: {Setup: []Step{createA}, Act: []Step{vmctlStep(false, "vm", "clone", "--name", directVM, "base")}},
	"start": {Setup: []Step{createA, directClone, vmctlStep(true, "vm", "stop", directVM)},
		Act: []Step{vmctlStep(false, "vm", "start", directVM)}},
	"vm-create": {Setup: []Step{createA}, Act: []Step{vmctlStep(false, "vm", "create", "--name", directVM, ArgImage)}},
	"stop":      {Setup: []Step{createA}, Act: []Step{directClone, vmctlStep(false, "vm", "stop", directVM)}},
	"rm":        {Setup: []Step{createA}, Act: []Step{directClone, vmctlStep(false, "vm", "rm", "--force", directVM)}},
	"net":       {Setup: []Step{createA}, Act: []Step{directClone, vmctlStep(false, "vm", "net", directVM, "--nics", "0")}},
	"snapshot-rm": {Setup: []Step{createA, directClone, vmctlStep(true, "snapshot", "save", "--name", directVM+"-snap", directVM)},
		Act: []Step{vmctlStep(false, "snapshot", "rm", directVM+"-snap")}},
}

// directVerbScenario is the case of a cell of a manager verb run by itself
// (no agent operation): the harness runs the verb, parked at the point with
// the kind's fault, or with the failpoint action at the point; the vmctl
// daemon runs, so what a verb killed mid-flight left is collected.
func directVerbScenario(c CoverageCell) (Scenario, string) {
	v := directVerbs[c.Op]
	s := Scenario{
		ID:      "cov-" + c.Op + "-" + strings.ReplaceAll(c.Point, ".", "-") + "-" + c.Kind,
		SeedRef: "coverage", Op: c.Op, Speed: "nightly",
		Setup:  v.Setup,
		Act:    v.Act,
		Env:    Env{RestartDelay: 1 * time.Second, Daemon: true, DaemonEvery: 5 * time.Second},
		Labels: []string{"coverage", "direct", "point:" + c.Point, "kind:" + c.Kind},
	}
	verb := strings.Join(v.Act[len(v.Act)-1].Args[:2], " ")
	park := Fault{Trigger: "park " + c.Point}
	switch {
	case covActions[c.Kind] != "":
		s.Title = fmt.Sprintf("failpoint action %s at %s during a harness-run %s", covActions[c.Kind], c.Point, verb)
		s.Env.Failpoints = c.Point + "=" + covActions[c.Kind]
		s.Faults = []Fault{{Kind: "failpoint", Trigger: "at " + c.Point, Window: [2]string{c.Point, lastPoint(c.Op)}}}
		s.Labels = append(s.Labels, "trigger:at")
		return s, ""
	case c.Kind == FaultPowerCut:
		park.Kind = FaultPowerCut
		s.Env.RestartDelay = 5 * time.Second
	case c.Kind == FaultSigkillDirect:
		// at a VMM point the park holds the VMM the verb waits on, and
		// the runner kills the harness's vmctl in flight, not the VMM
		park.Kind = FaultSigkillDirect
	case c.Kind == "sigkill-vmm":
		park.Kind, park.VM = "sigkill-vmm", directVM
	case c.Kind == "sigkill-daemon":
		park.Kind, park.Unit = "sigkill-main", "daemon"
	default:
		return Scenario{}, "no harness-run " + verb + " shape for " + c.Kind
	}
	s.Title = fmt.Sprintf("%s while parked at %s during a harness-run %s", c.Kind, c.Point, verb)
	s.Faults = []Fault{park}
	s.Labels = append(s.Labels, "trigger:park")
	return s, ""
}

// daemonSetup leaves the vmctl daemon one repair to commit: a VM of the
// harness's own whose VMM died under a running record (convergeDead
// records it stopped), beside the agent's bystander VM (intent-goal's
// evidence).
var daemonSetup = []Step{createA, directClone, {Kind: StepKillVMM, VM: directVM}}

// daemonScenario is the case of a cell of the daemon's own context: its
// pass and the store commits of its repairs. The case's failpoints go to
// the daemon alone, started after the arm (Env.DaemonArmed), so its first
// pass and first commit are the points' first hits: parked there with the
// daemon's SIGKILL or a power cut, or the failpoint action there.
func daemonScenario(c CoverageCell) (Scenario, string) {
	s := Scenario{
		ID:      "cov-daemon-" + strings.ReplaceAll(c.Point, ".", "-") + "-" + c.Kind,
		SeedRef: "coverage", Op: "daemon", Speed: "nightly",
		Setup: daemonSetup,
		Env:   Env{RestartDelay: 1 * time.Second, Daemon: true, DaemonEvery: 5 * time.Second, DaemonArmed: true},
		// the daemon's repair of the dead VMM must be done when the
		// case ends, whatever the fault: its record stopped
		Labels: []string{"coverage", "daemon", "point:" + c.Point, "kind:" + c.Kind},
	}
	if c.Point == "store.commit.before-rename" && (c.Kind == "sigkill-daemon" || c.Kind == CovFailpointKill) {
		// the daemon killed mid-commit: a commit that is not a rename
		// over the index leaves it torn
		s.Targets = []string{"store-commit-in-place"}
	}
	park := Fault{Trigger: "park " + c.Point}
	switch {
	case covActions[c.Kind] != "":
		s.Title = fmt.Sprintf("failpoint action %s at the vmctl daemon's %s", covActions[c.Kind], c.Point)
		s.Env.Failpoints = c.Point + "=" + covActions[c.Kind]
		s.Faults = []Fault{{Kind: "failpoint", Trigger: "at " + c.Point, Window: [2]string{c.Point, "daemon.pass"}}}
		s.Labels = append(s.Labels, "trigger:at")
		return s, ""
	case c.Kind == "sigkill-daemon":
		park.Kind, park.Unit = "sigkill-main", "daemon"
	case c.Kind == FaultPowerCut:
		park.Kind = FaultPowerCut
		s.Env.RestartDelay = 5 * time.Second
	default:
		return Scenario{}, "no shape of the daemon's own context for " + c.Kind
	}
	s.Title = fmt.Sprintf("%s while the vmctl daemon is parked at %s", c.Kind, c.Point)
	s.Faults = []Fault{park}
	s.Labels = append(s.Labels, "trigger:park")
	return s, ""
}

// startupScenario is the case of a cell of the agent's startup: the
// operator restarts the agent under a ready VM (StepRestartAgent), whose
// new incarnation alone is armed at the startup point: parked there with
// the kind's fault (the matrix's shape; restart-in-recovery's second
// restart at the next incarnation's reconciled), or the failpoint action
// there. The VM keeps running throughout: its ledger must hold.
func startupScenario(c CoverageCell) (Scenario, string) {
	restart := []Step{{Kind: StepRestartAgent}}
	var s Scenario
	if mk, ok := matrixKindNamed(c.Kind); ok {
		s = matrixScenario(matrixCell{Op: c.Op, Point: failpointPoint(c.Point), Kind: mk, VMMAlive: true, Indexed: true}, "nightly")
		s.Faults[0].VM = "" // no VM: the agent's own point
		if len(s.Faults) > 1 && strings.HasPrefix(s.Faults[1].Trigger, "at ") {
			s.Faults[1].Window[1] = "agent.startup.reconciled"
			if s.Faults[1].Trigger == "at "+c.Point {
				// the parked incarnation's hit is the first: the
				// recovery's is the next incarnation's
				s.Faults[1].Trigger += "#2"
			}
		}
		s.Labels = append([]string{"coverage", "point:" + c.Point, "kind:" + c.Kind}, s.Labels[1:2]...)
		if mk.Second != nil {
			s.Labels = append(s.Labels, "double")
		}
		s.Title = fmt.Sprintf("%s while an operator's restart of the agent is parked at %s", c.Kind, c.Point)
	} else {
		cc := c
		cc.Op = OpHibernate // coverageScenario's ready-VM shape; the act is replaced below
		var why string
		if s, why = coverageScenario(cc); why != "" {
			return Scenario{}, why
		}
		if s.Faults[0].Kind == "failpoint" {
			s.Faults[0].Window[1] = "agent.startup.reconciled"
			s.Env.Failpoints = c.Point + "=" + covActions[c.Kind] // no VM: the agent's own point
		}
		s.Faults[0].VM = ""
		s.Title = fmt.Sprintf("%s at %s of an operator's restart of the agent", c.Kind, c.Point)
	}
	s.ID = "cov-agent-" + strings.ReplaceAll(c.Point, ".", "-") + "-" + c.Kind
	s.Op, s.SeedRef, s.Speed = c.Op, "coverage", "nightly"
	s.Setup, s.Act, s.After = readyA, restart, nil
	s.Expect.Ledger = true
	if c.Kind == "sigkill-main" {
		// killed in its startup, the agent must start again: a lock
		// its death does not free keeps it from ever serving
		s.Targets = []string{"agent-pidfile-lock"}
	}
	return s, ""
}

// lastPoint is the last point of a context's path (a verb's window end).
func lastPoint(op string) string {
	for _, ctx := range coverContexts() {
		if ctx.Op == op {
			return ctx.Path[len(ctx.Path)-1]
		}
	}
	return ""
}

// viaOpShape is the agent operation a cell of the agent's lifecycle or of
// the registry context is reached in: the operation has no such cell, so a
// landing there falls back to the context (CoverageFallbackOps).
type viaOpShape struct {
	Op    string
	Setup []Step
	Act   []Step // nil: the operation's own act
	Env   Env    // its Failpoints are what makes the point come (after the case's own action)
	After []Step // what ends the shape's own interference (the operator's retry of a wedge)
	// FailedOK: the shape writes a transient failed on purpose
	FailedOK bool
}

// transientHibernateFailure makes a hibernate write failed once (s001-5's
// shape): one error of the agent's own step, one attempt.
var transientHibernateFailure = Env{RestartDelay: 1 * time.Second,
	Failpoints: "agent.hibernate.dhcp-released=1*error(transient DHCP release blip)@vm=" + vmA,
	AgentFlags: []string{"--retry-attempts=1"}}

// viaOp are the points of those contexts an operation passes for the
// intent's VM on every run: the agent's children of a create (the clone),
// its hibernate-evidence lookup, the push and pull of an agent with a real
// registry; a transient failure's agent.failed; the watcher's report of a
// VMM killed under a ready VM; the wedge of a create failed once and
// parked past its budget. Its startup comes only after another fault or an
// operator's restart: no shape here.
var viaOp = map[string]viaOpShape{
	"agent.child.exec":      {Op: OpCreate, Env: Env{RestartDelay: 1 * time.Second}},
	"agent.child.exit":      {Op: OpCreate, Env: Env{RestartDelay: 1 * time.Second}},
	"agent.evidence.lookup": {Op: OpCreate, Env: Env{RestartDelay: 1 * time.Second}},
	pointPushBlobs:          {Op: OpHibernate, Setup: readyA, Env: registryEnv},
	pointPullManifest:       {Op: OpWake, Setup: coldHibernated, Env: registryEnv},
	// a transient failure of the hibernate writes failed; the intent
	// leaves it by itself
	"agent.failed": {Op: OpHibernate, Setup: readyA, Env: transientHibernateFailure, FailedOK: true},
	// a create failed once after its clone with no automatic retry
	// left, parked past its budget until the operator's retry
	// (s001-obs-wedge-visible's shape): the wedge watch reports it
	"agent.wedged": {Op: OpCreate, FailedOK: true, After: []Step{{Kind: StepOperatorRetry, VM: vmA}},
		Env: Env{RestartDelay: 1 * time.Second, Failpoints: "agent.create.cloned=1*error(post-clone setup blip)@vm=" + vmA,
			AgentFlags: []string{"--retry-attempts=0", "--ready-budget=40s", "--retry-max=20s"}}},
	// the VMM killed the way an OOM kill does: the watcher reports it
	"agent.child.vm-died": {Op: OpCreate, Setup: readyA, Act: []Step{{Kind: StepKillVMM, VM: vmA}},
		Env: Env{RestartDelay: 1 * time.Second}},
}

// viaOpScenario is the case of a cell reached inside operation v.Op: a
// matrix kind parked at the point for the intent's VM (matrixScenario's
// shape), a power cut parked there, or the failpoint action there.
func viaOpScenario(c CoverageCell, v viaOpShape) (Scenario, string) {
	var s Scenario
	if mk, ok := matrixKindNamed(c.Kind); ok {
		s = matrixScenario(matrixCell{Op: v.Op, Point: failpointPoint(c.Point), Kind: mk, VMMAlive: v.Op != OpCreate, Indexed: true}, "nightly")
		s.Labels = []string{"trigger:park"}
		if mk.Second != nil {
			s.Labels = append(s.Labels, "double")
		}
	} else {
		cc := c
		cc.Op = v.Op
		var why string
		if s, why = coverageScenario(cc); why != "" {
			return Scenario{}, why
		}
		s.Labels = s.Labels[3:] // its trigger label; the cell's are set below
		if s.Faults[0].Kind == "failpoint" {
			// the case's action first: FailpointAction and the runner
			// read the first rule as the fault
			s.Env.Failpoints = c.Point + "=" + covActions[c.Kind] + "@vm=" + vmA
		} else {
			s.Faults[0].VM = vmA
		}
	}
	s.ID = "cov-" + c.Op + "-" + strings.ReplaceAll(c.Point, ".", "-") + "-" + c.Kind
	s.SeedRef, s.Speed = "coverage", "nightly"
	s.Title = fmt.Sprintf("%s at %s inside a %s (%s context)", c.Kind, c.Point, v.Op, c.Op)
	s.Labels = append([]string{"coverage", "point:" + c.Point, "kind:" + c.Kind}, s.Labels...)
	if v.Setup != nil {
		s.Setup = v.Setup
	}
	if v.Act != nil {
		s.Act = v.Act
		s.Expect.Ledger = false // the act kills the VMM: its RAM is gone
	}
	if v.After != nil {
		s.After = v.After
	}
	restart := s.Env.RestartDelay
	s.Env.Registry, s.Env.AgentFlags = v.Env.Registry, v.Env.AgentFlags
	if v.Env.Registry == RegistryOCI {
		s.Labels = append(s.Labels, LabelRegistryOCI)
	}
	if restart == 0 {
		s.Env.RestartDelay = v.Env.RestartDelay
	}
	if v.Env.Failpoints != "" {
		s.Env.Failpoints = strings.TrimPrefix(s.Env.Failpoints+";"+v.Env.Failpoints, ";")
	}
	s.Expect.FailedOK = v.FailedOK
	return s, ""
}

// matrixKindNamed is the matrix kind called name.
func matrixKindNamed(name string) (MatrixKind, bool) {
	for _, k := range MatrixKinds {
		if k.Name == name {
			return k, true
		}
	}
	return MatrixKind{}, false
}

// failpointPoint is the catalogue entry of a denominator cell's point
// (every cell's point is catalogued: coverFacts panics otherwise).
func failpointPoint(name string) failpoint.Point {
	p, _ := failpoint.Lookup(name)
	return p
}

// directSaveScenario is a save cell's sigkill-direct: an operator's
// `snapshot save` the harness runs itself on the agent's ready VM, killed
// parked at the point; the daemon collects what the dead save left, and a
// hibernate after it must still go through (s001-2's shape). A VMM point
// is parked by the VMM, not the harness's vmctl: no shape there.
func directSaveScenario(c CoverageCell) (Scenario, string) {
	if c.Op != OpSave {
		return Scenario{}, "sigkill-direct outside the save: no harness-run verb of " + c.Op + " to kill"
	}
	s := Scenario{
		ID:      "cov-save-" + strings.ReplaceAll(c.Point, ".", "-") + "-" + c.Kind,
		Title:   fmt.Sprintf("an operator's snapshot save SIGKILLed parked at %s; a hibernate after it", c.Point),
		SeedRef: "coverage", Op: OpSave, Speed: "nightly",
		Setup:  readyA,
		Act:    []Step{{Kind: StepDirectSave, VM: vmA}},
		Faults: []Fault{{Kind: FaultSigkillDirect, Trigger: "park " + c.Point}},
		After:  []Step{{Kind: StepHibernate, VM: vmA}},
		Env:    Env{RestartDelay: 1 * time.Second, Daemon: true, DaemonEvery: 5 * time.Second},
		Expect: Expect{Ledger: true},
		Labels: []string{"coverage", "point:" + c.Point, "kind:" + c.Kind, "trigger:park"},
	}
	if c.Proc == "fakech" {
		// a VMM point parks only in a VMM the armed stack started: the
		// act creates the VM (its create resumes it once first), and the
		// park holds the VMM while the runner kills the save's vmctl
		s.Title = fmt.Sprintf("an operator's snapshot save SIGKILLed while its VMM is parked at %s; a hibernate after it", c.Point)
		s.Setup = nil
		s.Act = []Step{createA, ledgerA, {Kind: StepDirectSave, VM: vmA}}
		if createHits(c.Point) {
			s.Faults[0].Trigger += "#2"
		}
	}
	return s, ""
}

// asyncAt reports the matrix's AsyncNext fact of (op, point).
func asyncAt(op, point string) bool {
	for _, c := range matrixCells() {
		if c.Op == op && c.Point.Name == point {
			return c.AsyncNext
		}
	}
	return false
}

// migrateCoverScenario is the case of a cell of the control plane sync
// (op:migrate): the migration's own shape (migrateMatrix's: vm-a placed on
// node A with ledger markers, its placement moved to node B), with the
// kind's fault on node A's agent parked at the point for vm-a (the matrix's
// fault; restart-in-recovery's second restart at the restarted agent's
// reconciled), the node's power cut there, or the failpoint action there.
// Node A hits agent.migrate.applied for vm-a first when it applies the
// move as a hibernate (the setup's placement ran unarmed), and
// agent.migrate.released once, when it released vm-a. Whatever the fault,
// the migration must end by itself with vm-a live on node B alone, woken
// from the registry with its RAM (StepAwaitMigrated: the ledger there).
func migrateCoverScenario(c CoverageCell) (Scenario, string) {
	s := Scenario{
		ID:      "cov-" + c.Op + "-" + strings.ReplaceAll(c.Point, ".", "-") + "-" + c.Kind,
		SeedRef: "coverage", Op: OpMigrate, Speed: "nightly",
		Setup:    placedA,
		Act:      []Step{{Kind: StepMigrate, VM: vmA, Node: NodeB}},
		After:    []Step{{Kind: StepAwaitMigrated, VM: vmA, Node: NodeB}},
		Env:      migrateEnv,
		Backends: []string{"fake"},
		Labels:   []string{"coverage", "point:" + c.Point, "kind:" + c.Kind},
	}
	mk, matrix := matrixKindNamed(c.Kind)
	switch {
	case covActions[c.Kind] != "":
		s.Title = fmt.Sprintf("failpoint action %s at node A's %s of vm-a's migration to node B: the migration ends by itself with vm-a live on node B alone with its RAM", covActions[c.Kind], c.Point)
		s.Env.Failpoints = c.Point + "=" + covActions[c.Kind] + "@vm=" + vmA
		s.Faults = []Fault{{Kind: "failpoint", Trigger: "at " + c.Point, Window: [2]string{c.Point, lastPoint(OpMigrate)}}}
		s.Labels = append(s.Labels, "trigger:at")
	case c.Kind == FaultPowerCut:
		s.Title = fmt.Sprintf("power cut of node A parked at %s of vm-a's migration to node B: once node A booted again the migration ends by itself with vm-a live on node B alone with its RAM", c.Point)
		s.Faults = []Fault{{Kind: FaultPowerCut, Trigger: "park " + c.Point, VM: vmA}}
		// as packaged: the unit starts again 5 s (scaled) after the boot
		s.Env.RestartDelay = 5 * time.Second
		s.Labels = append(s.Labels, "trigger:park")
	case matrix && mk.First.Unit == "" && mk.First.Kind != "sigkill-vmm" && mk.First.Kind != "sigkill-child" && !mk.KillsVMM:
		f := mk.First
		f.Trigger, f.VM = "park "+c.Point, vmA
		s.Faults = []Fault{f}
		s.Title = fmt.Sprintf("%s of node A's agent parked at %s of vm-a's migration to node B: the migration ends by itself with vm-a live on node B alone with its RAM", c.Kind, c.Point)
		if mk.Second != nil {
			g := *mk.Second
			g.Window = [2]string{strings.TrimPrefix(g.Trigger, "at "), lastPoint(OpMigrate)}
			s.Faults = append(s.Faults, g)
			s.Labels = append(s.Labels, "double")
			s.Title = fmt.Sprintf("double fault %s on node A's agent at %s of vm-a's migration to node B (killed there, restarted again at its recovery's reconciled): the migration ends by itself with vm-a live on node B alone with its RAM", c.Kind, c.Point)
		}
		if mk.Restart > 0 {
			s.Env.RestartDelay = mk.Restart
		}
		s.Labels = append(s.Labels, "trigger:park")
	default:
		return Scenario{}, "no migration shape for " + c.Kind + " (a kind that kills the VMM or a child: the control plane sync has neither)"
	}
	s.Labels = append(s.Labels, LabelRegistryOCI)
	return s, ""
}

// ledgerScenario is the case of a cell of the ledger's own markers (op
// context "ledger", the harness's guest writer): vm-a ready with a first
// marker acked, then the harness writes its next marker and is parked at
// the point (runner/ledgerpark.go: the writer traces and parks itself
// there), where vm-a's VMM is SIGKILLed or the node's power cut. Parked at
// ledger.marker.intent the marker is journaled and not in the guest yet;
// at ledger.marker.written the guest synced its disk marker and made its
// RAM marker, the ack not journaled yet (it is once released: the guest
// confirmed it before the fault). The agent must bring vm-a back by
// itself, and every marker acked before or at the fault keep its disk
// marker (ledger-clean; a fresh boot is what a dead VMM leaves, so its RAM
// markers are not owed).
func ledgerScenario(c CoverageCell) (Scenario, string) {
	s := Scenario{
		ID:      "cov-ledger-" + strings.ReplaceAll(c.Point, ".", "-") + "-" + c.Kind,
		SeedRef: "coverage", Op: "ledger", Speed: "nightly",
		Setup:  readyA,
		Act:    []Step{ledgerA},
		Env:    Env{RestartDelay: 1 * time.Second},
		Expect: Expect{Ledger: true},
		Labels: []string{"coverage", "point:" + c.Point, "kind:" + c.Kind, "trigger:park"},
	}
	park := Fault{Trigger: "park " + c.Point}
	switch c.Kind {
	case "sigkill-vmm":
		park.Kind, park.VM = "sigkill-vmm", vmA
		s.Title = fmt.Sprintf("vm-a's VMM SIGKILLed while the harness's ledger write into its guest is parked at %s: the agent brings vm-a back, every acked marker kept on its disk", c.Point)
	case FaultPowerCut:
		park.Kind = FaultPowerCut
		// as packaged: the unit starts again 5 s (scaled) after the boot
		s.Env.RestartDelay = 5 * time.Second
		s.Title = fmt.Sprintf("power cut of the node while the harness's ledger write into vm-a's guest is parked at %s: the rebooted agent brings vm-a back, every acked marker kept on its disk", c.Point)
	default:
		return Scenario{}, "no ledger shape for " + c.Kind
	}
	s.Faults = []Fault{park}
	return s, ""
}

// ejectRefusedScenario is error at ch.eject.acked: a guest that never acks
// the eject of a NIC (fakech/devtree.go), so the node stays in the VMM's
// device tree for good. The product refuses to go on over it: vm net exits
// "eject pending" (the record keeps the ids), and a hibernate's NIC drop
// fails the same way, is run again (nodeagent/eject.go) and ends the
// hibernate failed, never saving the half-gone NIC. The cases expect that
// refusal, then take the operator's way out, which must work over the
// pending eject: the VM removed (its VMM and the pending node with it).
// The VMM is started armed (the act clones it), so fakech runs the action.
func ejectRefusedScenario(c CoverageCell) (Scenario, string) {
	s := Scenario{
		ID:      "cov-" + c.Op + "-" + strings.ReplaceAll(c.Point, ".", "-") + "-" + c.Kind,
		SeedRef: "coverage", Op: c.Op, Speed: "nightly",
		Backends: []string{"fake"},
		Env:      Env{RestartDelay: 1 * time.Second, Failpoints: c.Point + "=" + covActions[c.Kind]},
		Labels:   []string{"coverage", "point:" + c.Point, "kind:" + c.Kind, "trigger:at"},
	}
	switch c.Op {
	case OpHibernate:
		s.Title = "the guest never acks the eject of the hibernate's NIC drop: the hibernate is refused (eject pending, run again, then failed with no retry left), nothing saved; the operator deletes vm-a over the pending eject"
		s.Act = armedHibernate
		s.After = []Step{{Kind: StepExpectParked, VM: vmA, Refused: "eject pending"}, {Kind: StepDelete, VM: vmA, Wait: true}}
		s.Faults = []Fault{{Kind: "failpoint", Trigger: "at " + c.Point, Window: [2]string{c.Point, "agent.failed"}}}
		// no automatic retry: the refusal parks at once
		s.Env.AgentFlags = []string{"--retry-attempts=0"}
		s.Expect.FailedOK = true
	case "net":
		s.Title = "the guest never acks the eject of a harness-run vm net's NIC: vm net is refused (eject pending), and vm rm --force removes the VM over the pending eject"
		s.Setup = []Step{createA}
		net := vmctlStep(true, "vm", "net", directVM, "--nics", "0")
		net.Refused = "eject pending"
		s.Act = []Step{directClone, net}
		s.After = []Step{vmctlStep(true, "vm", "rm", "--force", directVM)}
		s.Faults = []Fault{{Kind: "failpoint", Trigger: "at " + c.Point, Window: [2]string{c.Point, lastPoint(c.Op)}}}
	default:
		return Scenario{}, "no refusal shape for error at " + c.Point + " during " + c.Op
	}
	return s, ""
}
