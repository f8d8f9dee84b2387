package scenarios

import (
	"strings"

	"github.com/vmchaos/vmchaos/failpoint"
)

// The coverage denominator (issue #31 "coverage that tells the truth"):
// every failpoint of the catalogue × every fault kind that applies there,
// per operation context. A cell is (operation, point, kind); it is in the
// denominator when no applies rule below excludes it, whether or not the
// matrix generates a case for it and whether or not this host can run it
// (a cell the host cannot run is marked with the reason, never dropped).
// The matrix's own exclusion rules that are about building a park case
// (park-hit-earlier, vmm-moves-on-async) are not applies rules: a timed
// fault can still reach those cells.

// Failpoint-action coverage kinds: the VMCHAOS_FAILPOINTS action (Fault kind
// "failpoint") the process runs on itself at the point.
const (
	CovFailpointKill  = "failpoint-kill"
	CovFailpointExit  = "failpoint-exit"
	CovFailpointError = "failpoint-error"
)

// CoverageKindNames is the map's columns: the matrix kinds, then the power
// cut, the harness's SIGKILL of a vmctl it runs itself, and the failpoint
// actions.
func CoverageKindNames() []string {
	var out []string
	for _, k := range MatrixKinds {
		out = append(out, k.Name)
	}
	return append(out, FaultPowerCut, FaultSigkillDirect, CovFailpointKill, CovFailpointExit, CovFailpointError)
}

// CoverageVictimProc is the process a kind hits, whose last phase before
// the fault is the phase it landed in: the agent for the agent's kinds and
// the double faults (their first fault is the agent's), vmctl for a child,
// the daemon or a harness-run vmctl, the VMM for sigkill-vmm. "" for the
// power cut (every process: the stack's last phase is some hit process's)
// and the failpoint actions (the action's own point).
func CoverageVictimProc() map[string]string {
	out := map[string]string{}
	for _, k := range MatrixKinds {
		out[k.Name] = "nodeagent"
	}
	for _, n := range []string{"sigkill-child", "sigkill-daemon", FaultSigkillDirect} {
		out[n] = "vmctl"
	}
	out["sigkill-vmm"] = "fakech"
	return out
}

// coverContext is one operation context: the points an operation passes,
// in order, and who drives it.
type coverContext struct {
	Op     string
	Agent  bool // an agent operation is in flight: the agent's kinds apply
	Direct bool // the harness runs the vmctl verb itself: sigkill-direct applies
	Alive  bool // the VM has a VMM when the context starts
	Path   []string
}

// verbContexts are the manager verbs run by themselves (a vmctl the
// harness runs, the daemon's pass) and the contexts of points no operation
// path holds: the agent's own lifecycle and the guest ledger's markers.
// "save" is both the hibernate's save and the harness's direct save: it is
// merged into the matrix's save context (Direct there).
var verbContexts = []coverContext{
	{Op: "vm-create", Direct: true, Path: []string{"vm.create.reserved", "vm.create.created", "vm.create.committed"}},
	{Op: OpClone, Direct: true, Path: []string{"vm.clone.reserved", "vm.clone.files-copied", "vm.clone.vmm-launched",
		"ch.restore.begin", "ch.restore.done", "vm.clone.restored", "ch.net.added", "ch.resume", "vm.clone.resumed",
		"vm.clone.committed"}},
	{Op: "start", Direct: true, Path: []string{"vm.start.locked", "ch.cli.start", "ch.boot", "vm.start.booted"}},
	{Op: "stop", Direct: true, Alive: true, Path: []string{"ch.shutdown", "vm.stop.vmm-stopped"}},
	{Op: "rm", Direct: true, Alive: true, Path: []string{"vm.rm.tombstoned", "vm.rm.vmm-stopped", "vm.rm.done"}},
	{Op: "net", Direct: true, Alive: true, Path: []string{"ch.eject.requested", "ch.net.removed", "vm.net.removed",
		"ch.eject.acked", "vm.net.added"}},
	{Op: "snapshot-rm", Direct: true, Path: []string{"snapshot.rm.tombstoned", "snapshot.rm.done"}},
	{Op: "daemon", Path: []string{"daemon.pass", "store.commit.before-rename", "store.commit.after-rename"}},
	{Op: "agent", Agent: true, Path: []string{"agent.started", "agent.startup.reconciled", "agent.child.exec",
		"agent.child.exit", "agent.child.vm-died", "agent.failed", "agent.evidence.lookup", "agent.wedged"}},
	{Op: "ledger", Alive: true, Path: []string{"ledger.marker.intent", "ledger.marker.written"}},
	// the push and pull of an agent with --registry (registry:oci cases):
	// the agent's operation is in flight, no VMM (the VM is saved and
	// about to go, or not cloned yet)
	{Op: "registry", Agent: true, Path: []string{"agent.push.blobs", "agent.pull.manifest"}},
	// the control plane sync of a cluster node (op:migrate cases): the
	// agent applies a placement or releases a VM it hibernated (no VMM)
	{Op: OpMigrate, Agent: true, Path: []string{"agent.migrate.applied", "agent.migrate.released"}},
}

// coverContexts is every operation context: the matrix's agent operations
// (MatrixOps), then verbContexts.
func coverContexts() []coverContext {
	var out []coverContext
	for _, mo := range MatrixOps {
		out = append(out, coverContext{Op: mo.Op, Agent: true, Direct: mo.Op == OpSave,
			Alive: mo.Op != OpCreate && mo.Op != OpWake, Path: mo.Path})
	}
	return append(out, verbContexts...)
}

// CoverageFallbackOps are the contexts a credit falls back to, in order,
// when the case's own operation has no such cell (key "": every operation):
// a fault in a hibernate case that lands in its save, in a save case that
// lands in the hibernate around it, a migration's fault that lands in the
// hibernate (or save) it runs on its source, a harness-run verb inside a
// case of another operation, the agent's restart. No other agent operation
// is a fallback (a create's phase does not credit a wake).
func CoverageFallbackOps() map[string][]string {
	var all []string
	for _, c := range verbContexts {
		all = append(all, c.Op)
	}
	return map[string][]string{"": all, OpHibernate: {OpSave}, OpSave: {OpHibernate},
		// a migration runs a hibernate (and its save) on its source
		OpMigrate: {OpHibernate, OpSave}}
}

// coverFact is one candidate (operation, point, kind) with the facts the
// applies rules read.
type coverFact struct {
	Ctx      coverContext
	Point    failpoint.Point
	Kind     string
	VMMAlive bool   // the VM has a live VMM at this point on a clean run
	Indexed  bool   // the VM's record is in the index (not tombstoned)
	Child    string // the agent's vmctl child in flight ("" none, or no agent operation)
}

func (f coverFact) matrixKind() (MatrixKind, bool) {
	for _, k := range MatrixKinds {
		if k.Name == f.Kind {
			return k, true
		}
	}
	return MatrixKind{}, false
}

func (f coverFact) killsVMM() bool {
	k, ok := f.matrixKind()
	return ok && (k.First.Kind == "sigkill-vmm" || k.KillsVMM)
}

// agentKind: the kind's fault (its first) is the agent's or its child's.
func (f coverFact) agentKind() bool {
	k, ok := f.matrixKind()
	return ok && k.First.Kind != "sigkill-vmm" && k.First.Unit != "daemon"
}

func (f coverFact) failpointKind() bool { return strings.HasPrefix(f.Kind, "failpoint-") }

// coverRule excludes a class of cells from the denominator, with its reason.
type coverRule struct {
	Name     string
	Why      string
	Excludes func(coverFact) bool
}

// productProcs are the stack's processes (the ledger's points are the
// harness's guest writer: no failpoint action of the product runs there).
var productProcs = map[string]bool{"vmctl": true, "nodeagent": true, "fakech": true}

// coverRules is the applies rule: a kind applies at (operation, point) iff
// no rule excludes it. docs/scenarios.md "Coverage map" lists them.
var coverRules = []coverRule{
	{"agent-kind-needs-agent-op", "the agent's kinds (and its child's) matter where an agent operation or the agent's own lifecycle is in flight",
		func(f coverFact) bool { return f.agentKind() && !f.Ctx.Agent }},
	{"no-child-in-flight", "sigkill-child kills the agent's vmctl child in flight; here none is",
		func(f coverFact) bool { return f.Kind == "sigkill-child" && f.Child == "" }},
	{"no-vmm", "a VMM-killing kind where the VM has no VMM on a clean run",
		func(f coverFact) bool { return f.killsVMM() && !f.VMMAlive }},
	{"record-tombstoned", "a VMM-killing kind once the record left the index (the harness names a VMM through its record)",
		func(f coverFact) bool { return f.killsVMM() && !f.Indexed }},
	{"daemon-at-vmctl-points", "the vmctl daemon acts on vmctl's store: its death matters at vmctl points",
		func(f coverFact) bool { return f.Kind == "sigkill-daemon" && f.Point.Proc != "vmctl" }},
	{"double-at-agent-phases", "double faults are defined at the agent's phases",
		func(f coverFact) bool {
			k, ok := f.matrixKind()
			return ok && k.Second != nil && f.Point.Proc != "nodeagent"
		}},
	{"nothing-to-recover", "restart-in-recovery at the goal point or where only the lifecycle write is owed",
		func(f coverFact) bool {
			k, ok := f.matrixKind()
			return ok && k.Second != nil && k.Second.Kind == "restart" &&
				(f.Point.Name == opDone[f.Ctx.Op] || strings.HasPrefix(f.Point.NotYet, "lifecycle "))
		}},
	{"direct-needs-harness-verb", "sigkill-direct kills a vmctl the harness runs itself: only in a manager verb's context",
		func(f coverFact) bool { return f.Kind == FaultSigkillDirect && !f.Ctx.Direct }},
	{"failpoint-at-product-points", "a failpoint action runs in the process that hits the point: only the stack's processes",
		func(f coverFact) bool { return f.failpointKind() && !productProcs[f.Point.Proc] }},
}

// coverExclusion names the rule excluding f ("" = the kind applies).
func coverExclusion(f coverFact) string {
	for _, r := range coverRules {
		if r.Excludes(f) {
			return r.Name
		}
	}
	return ""
}

// CoverageCell is one cell of the denominator.
type CoverageCell struct {
	Op, Point, Proc, Kind string
}

// coverFacts walks every context's path and yields every candidate with
// the facts derived from the path (as matrixCells does): the VMM lives from
// vm.clone.vmm-launched or ch.cli.start until vm.rm.vmm-stopped or
// vm.stop.vmm-stopped; the record leaves the index at vm.rm.tombstoned; a
// VMM point's child is the verb of the next vmctl point on the path.
func coverFacts() []coverFact {
	var out []coverFact
	for _, ctx := range coverContexts() {
		alive, indexed := ctx.Alive, true
		for i, name := range ctx.Path {
			p, ok := failpoint.Lookup(name)
			if !ok {
				panic("coverage: point " + name + " is not in the failpoint catalogue")
			}
			switch name {
			case "vm.clone.vmm-launched", "ch.cli.start":
				alive = true
			case "vm.rm.vmm-stopped", "vm.stop.vmm-stopped":
				alive = false
			case "vm.rm.tombstoned":
				indexed = false
			}
			child := ""
			if ctx.Agent {
				child = childAt(ctx.Path, i, p)
			}
			for _, k := range CoverageKindNames() {
				out = append(out, coverFact{Ctx: ctx, Point: p, Kind: k, VMMAlive: alive, Indexed: indexed, Child: child})
			}
		}
	}
	return out
}

// childAt is the agent's vmctl child in flight at path[i]: a vmctl point's
// own verb, a VMM point's next vmctl point's verb.
func childAt(path []string, i int, p failpoint.Point) string {
	switch p.Proc {
	case "vmctl":
		return verbOf[p.Op]
	case "fakech":
		for _, next := range path[i+1:] {
			if np, _ := failpoint.Lookup(next); np.Proc == "vmctl" {
				return verbOf[np.Op]
			}
		}
	}
	return ""
}

var coverage = buildCoverage()

type coverageTable struct {
	cells    []CoverageCell
	excluded map[string]int
}

func buildCoverage() coverageTable {
	t := coverageTable{excluded: map[string]int{}}
	for _, f := range coverFacts() {
		if rule := coverExclusion(f); rule != "" {
			t.excluded[rule]++
			continue
		}
		t.cells = append(t.cells, CoverageCell{Op: f.Ctx.Op, Point: f.Point.Name, Proc: f.Point.Proc, Kind: f.Kind})
	}
	return t
}

// CoverageCells is the denominator: every applicable (operation, point,
// kind), contexts in order, points in path order, kinds in column order.
func CoverageCells() []CoverageCell { return append([]CoverageCell(nil), coverage.cells...) }

// CoverageExcluded is how many candidates each applies rule removed.
func CoverageExcluded() map[string]int { return coverage.excluded }

// FailpointAction is the point and coverage kind of a "failpoint" fault:
// the first kill, exit or error action of Env.Failpoints ("" when none).
func FailpointAction(s *Scenario) (point, kind string) {
	for _, rule := range strings.Split(s.Env.Failpoints, ";") {
		p, act, ok := strings.Cut(rule, "=")
		if !ok {
			continue
		}
		if n, rest, counted := strings.Cut(act, "*"); counted && n != "" && strings.Trim(n, "0123456789") == "" {
			act = rest
		}
		verb, _, _ := strings.Cut(act, "(")
		verb, _, _ = strings.Cut(verb, "@")
		switch strings.TrimSpace(verb) {
		case "kill":
			return strings.TrimSpace(p), CovFailpointKill
		case "exit":
			return strings.TrimSpace(p), CovFailpointExit
		case "error":
			return strings.TrimSpace(p), CovFailpointError
		}
	}
	return "", ""
}

// SnapshotOps are the operations that take a snapshot or restore one taken
// in the run (save, hibernate, clone, wake). On a host whose KVM cannot hand
// out the vCPUs' nested state, cloud-hypervisor v49+ cannot snapshot
// (realch.ReasonNestedState): their cells are marked not runnable with that
// reason, their cases inconclusive with it.
var SnapshotOps = []string{OpSave, OpHibernate, OpClone, OpWake}

// snapshotSteps are the harness steps that take a snapshot themselves.
var snapshotSteps = map[string]bool{StepHibernate: true, StepWake: true, StepDirectClone: true,
	StepDirectSave: true, StepOrphanPause: true, StepHoldLease: true}

// OpNeedsSnapshot reports an operation of SnapshotOps.
func OpNeedsSnapshot(op string) bool {
	for _, o := range SnapshotOps {
		if o == op {
			return true
		}
	}
	return false
}

// NeedsSnapshot reports a scenario whose operation, or any of whose steps,
// takes a snapshot.
func NeedsSnapshot(s *Scenario) bool {
	if OpNeedsSnapshot(s.Op) {
		return true
	}
	for _, steps := range [][]Step{s.Setup, s.Act, s.WhileStopped, s.After} {
		for _, st := range steps {
			if snapshotSteps[st.Kind] {
				return true
			}
		}
	}
	return false
}
