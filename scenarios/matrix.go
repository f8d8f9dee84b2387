package scenarios

import (
	"fmt"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
)

// The generated fault matrix (issue #18): every operation × every fault kind
// × every phase (park point) of that operation, minus the combinations an
// exclusion rule names, minus those a hand-written case already reaches
// (folded into it). Cases are labelled `matrix`; ids are
// mx-<op>-<point>-<kind>, stable as long as the tables below are.

// TriggerWhileDown is the trigger of a double fault's second fault: it fires
// once the first fault is in, while the agent is still down (stopped, dead
// before its restart, or frozen by SIGSTOP); a second fault that finds the
// agent back up did not land (the runner judges it, runner/double.go).
const TriggerWhileDown = "while-down"

// MatrixOps is the path of every operation: the park points it passes
// through, in order, as a trace of a clean create → hibernate → wake and of a
// delete shows them on the fake backend (store.* and agent.child.* are
// bookkeeping, not phases). "save" is the snapshot save inside a hibernate.
var MatrixOps = []struct {
	Op   string
	Path []string
}{
	{OpCreate, []string{"agent.create.begin", "vm.clone.reserved", "vm.clone.files-copied", "vm.clone.vmm-launched",
		"ch.restore.begin", "ch.restore.done", "vm.clone.restored", "ch.net.added", "ch.resume", "vm.clone.resumed",
		"vm.clone.committed", "agent.create.cloned", "agent.create.ready"}},
	{OpSave, []string{"snapshot.save.locked", "ch.pause", "snapshot.save.paused", "ch.snapshot.begin",
		"ch.snapshot.memory-writing", "ch.snapshot.memory-written", "ch.snapshot.done", "snapshot.save.captured",
		"ch.resume", "snapshot.save.resumed", "snapshot.save.unlocked", "snapshot.save.leased", "snapshot.save.pending",
		"snapshot.save.finalized"}},
	{OpHibernate, []string{"agent.hibernate.begin", "vm.start.locked", "agent.hibernate.dhcp-released",
		"ch.eject.requested", "ch.net.removed", "vm.net.removed", "ch.eject.acked", "vm.net.added",
		"agent.hibernate.nic-dropped", "agent.hibernate.saved", "agent.hibernate.pushed", "vm.rm.tombstoned",
		"vm.rm.vmm-stopped", "vm.rm.done", "agent.hibernate.removed", "agent.hibernate.done"}},
	{OpWake, []string{"agent.wake.begin", "agent.wake.pulled", "vm.clone.reserved", "vm.clone.files-copied",
		"vm.clone.vmm-launched", "ch.restore.begin", "ch.restore.done", "vm.clone.restored", "ch.net.added", "ch.resume",
		"vm.clone.resumed", "vm.clone.committed", "agent.wake.cloned", "snapshot.rm.tombstoned", "snapshot.rm.done",
		"agent.wake.ready"}},
	{OpDelete, []string{"agent.delete.begin", "vm.rm.tombstoned", "vm.rm.vmm-stopped", "vm.rm.done",
		"agent.delete.removed", "agent.delete.done"}},
}

// opGoal is what an operation's intent converges to; with the phase and the
// fault kind it is the key cases are folded on. A wake's ready restores the
// hibernated guest, which a create's does not.
var opGoal = map[string]string{OpCreate: "ready", OpSave: "hibernated", OpHibernate: "hibernated",
	OpWake: "ready (restored)", OpDelete: "deleted"}

// opDone is the point an operation's intent reaches its goal at (the close
// of a second fault's recovery window).
var opDone = map[string]string{OpCreate: "agent.create.ready", OpSave: "agent.hibernate.done",
	OpHibernate: "agent.hibernate.done", OpWake: "agent.wake.ready", OpDelete: "agent.delete.done"}

// MatrixKind is one fault kind of the matrix: a single fault, or a double
// fault (Second set). Name is the coverage map's column and the id's tail.
type MatrixKind struct {
	Name   string
	First  Fault  // Kind, Unit, StopFor (trigger and VM filled per case)
	Second *Fault // double fault: Trigger TriggerWhileDown, or an "at" in the recovery
	// KillsVMM: the VM's RAM is legitimately lost (no ledger check).
	KillsVMM bool
	Restart  time.Duration // agent RestartSec (real time); 0: 1 s
}

// MatrixKinds is the fault-kind table; a new kind (e.g. power-cut) is one
// more row plus, where it does not apply everywhere, a rule.
var MatrixKinds = []MatrixKind{
	{Name: "sigkill-main", First: Fault{Kind: "sigkill-main"}},
	{Name: "stop", First: Fault{Kind: "stop", StopFor: 1 * time.Second}},
	{Name: "restart", First: Fault{Kind: "restart"}},
	{Name: "kill-all", First: Fault{Kind: "kill-all"}},
	{Name: "sigkill-child", First: Fault{Kind: "sigkill-child"}},
	{Name: "sigkill-vmm", First: Fault{Kind: "sigkill-vmm"}, KillsVMM: true},
	{Name: "sigkill-daemon", First: Fault{Kind: "sigkill-main", Unit: "daemon"}},
	{Name: "sigstop-cont", First: Fault{Kind: "sigstop", StopFor: 2 * time.Second}},
	// double faults: the VMM dies while the agent is down (the agent must
	// not adopt the stale VM as running) ...
	{Name: "vmm-kill-while-stopped", First: Fault{Kind: "stop", StopFor: 1 * time.Second},
		Second: &Fault{Kind: "sigkill-vmm", Trigger: TriggerWhileDown}, KillsVMM: true},
	{Name: "vmm-kill-while-dead", First: Fault{Kind: "sigkill-main"},
		Second: &Fault{Kind: "sigkill-vmm", Trigger: TriggerWhileDown}, KillsVMM: true, Restart: 10 * time.Second}, // RestartSec 0.5 s at scale 0.05: the agent stays dead while the VMM is killed
	// frozen long enough (0.5 s at scale 0.05) for the harness to find
	// and kill the VMM before the SIGCONT
	{Name: "vmm-kill-while-frozen", First: Fault{Kind: "sigstop", StopFor: 10 * time.Second},
		Second: &Fault{Kind: "sigkill-vmm", Trigger: TriggerWhileDown}, KillsVMM: true},
	// ... and the agent restarts again while it recovers from the first.
	{Name: "restart-in-recovery", First: Fault{Kind: "sigkill-main"},
		Second: &Fault{Kind: "restart", Trigger: "at agent.startup.reconciled"}},
}

// matrixCell is one candidate (operation, point, kind) with the facts the
// exclusion rules read.
type matrixCell struct {
	Op       string
	Point    failpoint.Point
	Kind     MatrixKind
	VMMAlive bool   // the VM has a live VMM at this point on a clean run
	Indexed  bool   // the VM's record is in the index (not tombstoned) at this point
	Child    string // the vmctl verb in flight at this point (injector.ChildKind form), "" at agent points
	Armed    bool   // the case creates its VM after arming (a VMM point parks only in a VMM started armed)
	HitInAct bool   // the point is also hit by the armed act before this operation
	// AsyncNext: a later VMM phase of the same verb comes from another of
	// the VMM's goroutines, so parking this point does not hold the VMM.
	AsyncNext bool
}

// asyncVMMPoints are VMM phases a goroutine of their own reaches, whatever
// the API handler does: the guest acks an eject on its own clock.
var asyncVMMPoints = map[string]bool{"ch.eject.acked": true}

// matrixRule excludes a class of combinations, with its reason.
type matrixRule struct {
	Name     string
	Why      string
	Excludes func(matrixCell) bool
}

func (c matrixCell) vmmFault() bool { return c.Kind.First.Kind == "sigkill-vmm" || c.Kind.KillsVMM }
func (c matrixCell) double() bool   { return c.Kind.Second != nil }

// matrixRules is every exclusion; a combination is applicable iff none
// excludes it.
var matrixRules = []matrixRule{
	{"no-child-in-flight", "sigkill-child kills the vmctl child in flight; at an agent point none is (the agent is between children)",
		func(c matrixCell) bool { return c.Kind.First.Kind == "sigkill-child" && c.Child == "" }},
	{"no-vmm", "the VMM is not running at this point (not launched yet, or already stopped): there is no VMM to kill",
		func(c matrixCell) bool { return c.vmmFault() && !c.VMMAlive }},
	{"record-tombstoned", "the VM's record left the index (tombstoned): the harness names a VMM through its record",
		func(c matrixCell) bool { return c.vmmFault() && !c.Indexed }},
	{"daemon-at-vmctl-points", "the vmctl daemon acts on vmctl's store only: its death matters while a vmctl verb is in flight",
		func(c matrixCell) bool { return c.Kind.First.Unit == "daemon" && c.Point.Proc != "vmctl" }},
	{"park-hit-earlier", "the armed act's create hits the point before this operation does: a park cannot single out this operation's hit",
		func(c matrixCell) bool { return c.HitInAct }},
	{"vmm-moves-on-async", "a later VMM phase of the same verb (the guest's eject ack) comes from another of the VMM's goroutines; fakech tells the guest once the request's phases are passed, so a park holds the ack, but these cells are left to the nightly coverage cases (make chaos's selection unchanged)",
		func(c matrixCell) bool { return c.AsyncNext }},
	{"double-at-agent-phases", "double faults are defined at the agent's phases (the agent is the process taken down first)",
		func(c matrixCell) bool { return c.double() && c.Point.Proc != "nodeagent" }},
	{"nothing-to-recover", "at the goal point nothing is owed, and where only the lifecycle write is (the catalogue's not-yet), the recovery is over before a restart at startup can hit it",
		func(c matrixCell) bool {
			return c.double() && c.Kind.Second.Kind == "restart" &&
				(c.Point.Name == opDone[c.Op] || strings.HasPrefix(c.Point.NotYet, "lifecycle "))
		}},
}

// matrixExclusion names the rule excluding c ("" = applicable).
func matrixExclusion(c matrixCell) string {
	for _, r := range matrixRules {
		if r.Excludes(c) {
			return r.Name
		}
	}
	return ""
}

// verbOf maps a vmctl point's catalogue op to the agent child running it
// (injector.ChildKind form).
var verbOf = map[string]string{"clone": "vm-clone", "save": "snapshot-save", "net": "vm-net", "rm": "vm-rm",
	"snapshot-rm": "snapshot-rm", "start": "vm-start", "create": "vm-create"}

// matrixCells walks every operation's path and yields every candidate with
// its facts derived from the path: the VMM is alive from vm.clone.vmm-launched
// (or from the start of an operation on a running VM) until
// vm.rm.vmm-stopped; the record leaves the index at vm.rm.tombstoned; a VMM
// point's child is the verb of the next vmctl point on the path.
func matrixCells() []matrixCell {
	var out []matrixCell
	for _, mo := range MatrixOps {
		alive := mo.Op != OpCreate && mo.Op != OpWake
		indexed := true
		for i, name := range mo.Path {
			p, ok := failpoint.Lookup(name)
			if !ok {
				panic("matrix: point " + name + " is not in the failpoint catalogue")
			}
			switch name {
			case "vm.clone.vmm-launched":
				alive = true
			case "vm.rm.vmm-stopped":
				alive = false
			case "vm.rm.tombstoned":
				indexed = false
			}
			child, asyncNext := "", false
			switch p.Proc {
			case "vmctl":
				child = verbOf[p.Op]
			case "fakech":
				for _, next := range mo.Path[i+1:] {
					if np, _ := failpoint.Lookup(next); np.Proc == "vmctl" {
						child = verbOf[np.Op]
						break
					}
				}
				// an async phase later in the same verb (the eject a
				// remove-device asked for is acked on the guest's clock)
				verb := child
				for _, next := range mo.Path[i+1:] {
					np, _ := failpoint.Lookup(next)
					if np.Proc == "vmctl" && verbOf[np.Op] != verb {
						break
					}
					if asyncVMMPoints[next] {
						asyncNext = true
					}
				}
			}
			armed := p.Proc == "fakech" && (mo.Op == OpSave || mo.Op == OpHibernate)
			hitInAct := armed && createHits(name)
			for _, k := range MatrixKinds {
				out = append(out, matrixCell{Op: mo.Op, Point: p, Kind: k, VMMAlive: alive, Indexed: indexed,
					Child: child, Armed: armed, HitInAct: hitInAct, AsyncNext: asyncNext})
			}
		}
	}
	return out
}

// createHits reports whether a create passes the point (an armed act
// creates the VM before it hibernates it).
func createHits(point string) bool {
	for _, p := range MatrixOps[0].Path {
		if p == point {
			return true
		}
	}
	return false
}

// MatrixPair is one applicable (point × fault kind) pair of the coverage map.
type MatrixPair struct {
	Point, Proc, Kind string
}

// Fold records a matrix case not generated because a catalogue case reaches
// the same (phase, fault kind, goal).
type Fold struct {
	Case, Into, Key string
}

// matrix is the generated part of the catalogue, built once.
type matrix struct {
	scenarios []Scenario
	pairs     []MatrixPair
	folds     []Fold
	excluded  map[string]int // rule → combinations it excluded
}

var generated = buildMatrix(append(withReal(seedScenarios), parkScenarios()...), chFidelityScenarios, matrixFound)

func init() {
	Catalogue = append(append(Catalogue, matrixFound...), generated.scenarios...)
	// last: the coverage cases fill the cells every other case left
	// untargeted (coverage_cases.go)
	coverageGen = buildCoverageCases(Catalogue)
	Catalogue = append(Catalogue, coverageGen.scenarios...)
}

// MatrixPairs is every applicable (point × fault kind) pair, in path order.
func MatrixPairs() []MatrixPair { return append([]MatrixPair(nil), generated.pairs...) }

// MatrixFolds lists the matrix cases folded into catalogue cases.
func MatrixFolds() []Fold { return append([]Fold(nil), generated.folds...) }

// MatrixExcluded is how many combinations each exclusion rule removed.
func MatrixExcluded() map[string]int { return generated.excluded }

// foldKey is (phase, fault kind, goal) of a scenario whose first fault is a
// park: the key cases are folded on ("" for other scenarios).
func foldKey(s *Scenario) string {
	if len(s.Faults) == 0 || !strings.HasPrefix(s.Faults[0].Trigger, "park ") {
		return ""
	}
	kind := CoverageKind(s)
	if kind == "" {
		return ""
	}
	p, _, _ := strings.Cut(strings.TrimPrefix(s.Faults[0].Trigger, "park "), "@")
	return strings.TrimSpace(p) + " × " + kind + " → " + opGoal[s.Op]
}

func buildMatrix(hand ...[]Scenario) matrix {
	m := matrix{excluded: map[string]int{}}
	byKey := map[string]string{}
	for _, ss := range hand {
		for i := range ss {
			if k := foldKey(&ss[i]); k != "" && byKey[k] == "" {
				byKey[k] = ss[i].ID
			}
		}
	}
	seenPair := map[MatrixPair]bool{}
	for _, c := range matrixCells() {
		if rule := matrixExclusion(c); rule != "" {
			m.excluded[rule]++
			continue
		}
		pair := MatrixPair{Point: c.Point.Name, Proc: c.Point.Proc, Kind: c.Kind.Name}
		// an operation repeating a pair an earlier operation already
		// covers runs nightly only (make chaos covers each pair once)
		speed := "slow"
		if seenPair[pair] {
			speed = "nightly"
		} else {
			seenPair[pair] = true
			m.pairs = append(m.pairs, pair)
		}
		s := matrixScenario(c, speed)
		if into := byKey[foldKey(&s)]; into != "" {
			m.folds = append(m.folds, Fold{Case: s.ID, Into: into, Key: foldKey(&s)})
			continue
		}
		byKey[foldKey(&s)] = s.ID
		m.scenarios = append(m.scenarios, s)
	}
	return m
}

// matrixScenario builds the case of one applicable cell.
func matrixScenario(c matrixCell, speed string) Scenario {
	k := c.Kind
	f := k.First
	f.Trigger = "park " + c.Point.Name
	if c.Point.Proc == "nodeagent" {
		f.VM = vmA
	}
	switch f.Kind {
	case "sigkill-child":
		f.Child = c.Child
	case "sigkill-vmm":
		f.VM = vmA
	}
	s := Scenario{
		ID:      "mx-" + c.Op + "-" + strings.ReplaceAll(c.Point.Name, ".", "-") + "-" + k.Name,
		Title:   fmt.Sprintf("%s while parked at %s during %s (%s)", k.Name, c.Point.Name, c.Op, c.Point.Happened),
		SeedRef: "matrix", Op: c.Op, Speed: speed,
		Faults: []Fault{f},
		Env:    Env{RestartDelay: 1 * time.Second},
		Labels: []string{"matrix", "trigger:park", "point:" + c.Point.Name, "kind:" + k.Name},
	}
	if k.Restart > 0 {
		s.Env.RestartDelay = k.Restart
	}
	if f.Unit == "daemon" {
		s.Env.Daemon, s.Env.DaemonEvery = true, 5*time.Second
	}
	if k.Second != nil {
		g := *k.Second
		if g.Kind == "sigkill-vmm" {
			g.VM = vmA
		}
		if strings.HasPrefix(g.Trigger, "at ") {
			g.Window = [2]string{strings.TrimPrefix(g.Trigger, "at "), opDone[c.Op]}
		}
		s.Faults = append(s.Faults, g)
		s.Labels = append(s.Labels, "double")
		s.Title = fmt.Sprintf("double fault %s at %s during %s (%s)", k.Name, c.Point.Name, c.Op, c.Point.Happened)
	}
	switch {
	case c.Op == OpCreate:
		s.Act = []Step{{Kind: StepCreate, VM: vmA}}
	case c.Op == OpWake:
		s.Setup = hibernated
		s.Act = []Step{{Kind: StepWake, VM: vmA}}
	case c.Op == OpDelete:
		s.Setup = []Step{createA}
		s.Act = []Step{{Kind: StepDelete, VM: vmA}}
	case c.Armed:
		// a VMM point parks only in a VMM started by the armed stack
		s.Act = armedHibernate
	default:
		s.Setup = readyA
		s.Act = []Step{{Kind: StepHibernate, VM: vmA}}
	}
	s.Expect.Ledger = c.Op != OpCreate && c.Op != OpDelete && !k.KillsVMM
	return s
}

// CoverageKind is the coverage kind a scenario exercises ("" when its
// faults are none of CoverageKindNames): the coverage map's column for its
// landing.
func CoverageKind(s *Scenario) string {
	single := func(f Fault) string {
		switch {
		case f.Kind == FaultPowerCut || f.Kind == FaultSigkillDirect:
			return f.Kind
		case f.Kind == "failpoint":
			_, kind := FailpointAction(s)
			return kind
		case f.Unit == "daemon" && f.Kind == "sigkill-main":
			return "sigkill-daemon"
		case f.Unit == "daemon":
			return ""
		case f.Unit == UnitNodeB || f.Unit == UnitControlPlane:
			// the second node's agent, or the control plane's process:
			// no cell is its own (not the parked process's)
			return ""
		case f.Kind == "sigstop" && f.StopFor > 0:
			return "sigstop-cont"
		case f.Kind == "sigstop":
			return "" // stays stopped: not the matrix's stop/cont pair
		}
		for _, k := range MatrixKinds {
			if k.Second == nil && k.First.Kind == f.Kind && k.First.Unit == "" {
				return k.Name
			}
		}
		return ""
	}
	switch len(s.Faults) {
	case 1:
		return single(s.Faults[0])
	case 2:
		a, b := s.Faults[0], s.Faults[1]
		// the second's trigger, whichever hit it waits for (#N)
		trig, _, _ := strings.Cut(b.Trigger, "#")
		for _, k := range MatrixKinds {
			if k.Second != nil && single(a) == single(k.First) && b.Kind == k.Second.Kind && trig == k.Second.Trigger {
				return k.Name
			}
		}
	}
	return ""
}
