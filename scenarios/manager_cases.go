package scenarios

import (
	"fmt"
	"slices"
	"strings"

	"github.com/vmchaos/vmchaos/manager"
)

// The manager-verb cases (layer:manager, docs/architecture.md §14): a
// manager's own CLI verbs are operations of the one catalogue, run through
// the one runner against the manager.Manager adapter that --manager picks
// (vmctl by default). Their cases are generated per manager, after the
// runner discovered which VMM phases each verb passes through on it, so
// they are not part of the static Catalogue (whose ids and counts the agent
// runs keep).

// Manager-case trigger kinds.
const (
	MgrTrigPark    = "park"     // the VMM parks at Point (failpoint pause); the verb is SIGKILLed there
	MgrTrigOffset  = "offset"   // the verb is SIGKILLed Fraction of its measured window after it started
	MgrTrigKillVMM = "kill-vmm" // kill -9 of the fixture VM's VMM while no verb runs
	MgrTrigNone    = "none"     // no fault: the verb's discovery failed (MgrCase.DiscoverErr)
	MgrTrigRace    = "race"     // the verb is parked at Point while a second verb (MgrCase.Race) races it
)

// Object names every manager case uses.
const (
	MgrSrcVM    = "src"  // the running VM of the fixture
	MgrBaseSnap = "base" // its snapshot
	MgrTarget   = "tgt"  // what the verb under test creates (clone: a VM, save: a snapshot)
	MgrCalib    = "calib"
)

// LayerManager is the label of every manager-verb case.
const LayerManager = "layer:manager"

// MgrOp is one manager verb under test: its call, the fixture it needs,
// the calibration of its window, and the recovery an embedder runs after
// the verb died. The recovery's last call is the retry, with the SAME names
// the dead verb used (an embedder retries its own request); it must
// succeed.
type MgrOp struct {
	Verb      manager.Verb
	Call      manager.Call
	Fixture   []manager.Call // after `create src` and `snapshot save base src`
	Recovery  []manager.Call
	Calibrate []manager.Call
}

// MgrCase is what makes a Scenario a manager-verb case.
type MgrCase struct {
	Manager  string
	Op       MgrOp
	Trigger  string
	Point    string  // park
	Fraction float64 // offset
	// DiscoverErr: the verb's unarmed run, which finds the VMM phases it
	// passes through, failed on this manager. The case reports that
	// failure (a product fail, manager-calibration) instead of the run
	// stopping before any case (issue 32 item 4).
	DiscoverErr string
	Race        *MgrRace // MgrTrigRace: the racing verb
	// ThenKillVMM (park): a double fault, the parked VMM kill -9ed while
	// the verb lies dead, before it could finish the dead client's request;
	// the recovery then meets both deaths.
	ThenKillVMM bool
	// VMMOnly (park): the parked VMM is kill -9ed while the verb waits on
	// it alive; the verb must end, and the recovery succeed.
	VMMOnly bool
	// PowerCut (park, offset): the power of the node is cut instead of the
	// verb being killed: the store on lazy filesystems, every process of
	// the case frozen and killed at once, every write not durable lost;
	// then the boot (the manager's own recovery, the VMs restarted) and
	// the retry (manager_matrix.go).
	PowerCut bool
	// Freeze (park): the verb is SIGSTOPped (with its children) while the
	// VMM is parked, the VMM finishes the request, and the verb is
	// SIGCONTed; it must come back (manager_matrix.go).
	Freeze bool
	// Workload (park, snapshot-save): the fixture's VM has a NIC and its
	// guest runs the ledger's writer from before the verb until after the
	// recovery; the snapshot the save and its retry leave is cloned and
	// the clone must hold exactly that save's cut (manager_matrix.go).
	Workload bool
}

// MgrRace is a second verb racing the verb under test as embedders make
// verbs race (issue 32 item 2): the verb under test is parked at Point, a
// VMM phase it passes through, while Racer runs.
type MgrRace struct {
	Name  string // the case is mgr-race-<Name>
	Op    MgrOp  // the verb under test
	Point string // where it is parked
	Racer manager.Call
	// HoldOff: the racer must not report success while the verb under
	// test is parked (a lease or lock makes it refuse or wait).
	HoldOff bool
	// OneWins: the two must not both succeed (two saves to one name).
	OneWins bool
	// VerbMustSucceed: once released, the verb under test must succeed.
	VerbMustSucceed bool
	Why             string
}

// MgrKeepSnap is a snapshot a race that removes base keeps beside it: the
// rm must leave it whole (unrelated-snapshots-untouched judges it instead of
// base), and the snapshot list is never legitimately empty.
const MgrKeepSnap = "keep"

// withFixture is op with more fixture calls.
func withFixture(op MgrOp, calls ...manager.Call) MgrOp {
	op.Fixture = append(slices.Clone(op.Fixture), calls...)
	return op
}

// MgrRaces are the races of the manager catalogue. The state invariants
// judge every one afterwards (no orphan VMM, no placeholder, one VM per
// name, the base snapshot's data).
var MgrRaces = []MgrRace{
	{Name: "snapshot-rm-under-clone", Op: withFixture(MgrOps[0], mcall(manager.VerbSnapshotSave, MgrSrcVM, "", MgrKeepSnap)),
		Point: "ch.restore.begin", Racer: mcall(manager.VerbSnapshotRm, "", MgrBaseSnap, ""),
		HoldOff: true, VerbMustSucceed: true,
		Why: "`snapshot rm base` while a clone of base is still reading it: the reader's lease makes the rm refuse or wait, never delete the data under a live reader"},
	{Name: "snapshot-rm-under-restore", Op: withFixture(MgrOps[2], mcall(manager.VerbSnapshotSave, MgrSrcVM, "", MgrKeepSnap)),
		Point: "ch.restore.begin", Racer: mcall(manager.VerbSnapshotRm, "", MgrBaseSnap, ""),
		HoldOff: true, VerbMustSucceed: true,
		Why: "`snapshot rm base` while a restore of src from base is still reading it: refused or held off, never the data deleted under a live reader"},
	{Name: "two-saves-one-name", Op: MgrOps[1], Point: "ch.snapshot.begin",
		Racer:   mcall(manager.VerbSnapshotSave, MgrSrcVM, "", MgrTarget),
		HoldOff: true, OneWins: true, VerbMustSucceed: true,
		Why: "a second `snapshot save --name tgt` while the first is capturing: refused or held off, never two snapshots of one name"},
	{Name: "rm-under-clone", Op: MgrOps[0], Point: "ch.restore.begin",
		Racer: mcall(manager.VerbRm, MgrTarget, "", ""),
		Why:   "`rm tgt` while the clone that creates tgt is in flight: refused, or the clone undone whole (no placeholder, no VMM left)"},
}

// Parks reports whether the case parks its verb at Point (a park kill or
// a race).
func (c *MgrCase) Parks() bool { return c.Trigger == MgrTrigPark || c.Trigger == MgrTrigRace }

func mcall(v manager.Verb, vm, snap, name string) manager.Call {
	return manager.Call{Verb: v, VM: vm, Snapshot: snap, Name: name}
}

// MgrOps is the data of the manager-verb cases.
var MgrOps = []MgrOp{
	{Verb: manager.VerbClone, Call: mcall(manager.VerbClone, "", MgrBaseSnap, MgrTarget),
		Recovery:  []manager.Call{mcall(manager.VerbRecoverStale, MgrTarget, "", ""), mcall(manager.VerbGC, "", "", ""), mcall(manager.VerbClone, "", MgrBaseSnap, MgrTarget)},
		Calibrate: []manager.Call{mcall(manager.VerbClone, "", MgrBaseSnap, MgrCalib)}},
	{Verb: manager.VerbSnapshotSave, Call: mcall(manager.VerbSnapshotSave, MgrSrcVM, "", MgrTarget),
		// `start` is what a user tries on a VM that looks stuck; it must
		// not report success over a VM it leaves Paused. The retry saves
		// under the same name: a refusal naming the holder is recovered
		// as the field does (runner: rm of the holder, wait for a lease).
		Recovery: []manager.Call{mcall(manager.VerbGC, "", "", ""), mcall(manager.VerbStart, MgrSrcVM, "", ""),
			mcall(manager.VerbSnapshotSave, MgrSrcVM, "", MgrTarget)},
		Calibrate: []manager.Call{mcall(manager.VerbSnapshotSave, MgrSrcVM, "", MgrCalib)}},
	{Verb: manager.VerbRestore, Call: mcall(manager.VerbRestore, MgrSrcVM, MgrBaseSnap, ""),
		// a restore's VM is running before it; one that died under it is
		// started again first, as for a save
		Recovery:  []manager.Call{mcall(manager.VerbGC, "", "", ""), mcall(manager.VerbStart, MgrSrcVM, "", ""), mcall(manager.VerbRestore, MgrSrcVM, MgrBaseSnap, "")},
		Calibrate: []manager.Call{mcall(manager.VerbRestore, MgrSrcVM, MgrBaseSnap, "")}},
	{Verb: manager.VerbRm, Call: mcall(manager.VerbRm, MgrSrcVM, "", ""),
		Recovery:  []manager.Call{mcall(manager.VerbGC, "", "", ""), mcall(manager.VerbRm, MgrSrcVM, "", "")},
		Calibrate: []manager.Call{mcall(manager.VerbClone, "", MgrBaseSnap, MgrCalib), mcall(manager.VerbRm, MgrCalib, "", "")}},
	{Verb: manager.VerbStop, Call: mcall(manager.VerbStop, MgrSrcVM, "", ""),
		Recovery:  []manager.Call{mcall(manager.VerbGC, "", "", ""), mcall(manager.VerbStop, MgrSrcVM, "", "")},
		Calibrate: []manager.Call{mcall(manager.VerbStop, MgrSrcVM, "", ""), mcall(manager.VerbStart, MgrSrcVM, "", "")}},
	{Verb: manager.VerbStart, Call: mcall(manager.VerbStart, MgrSrcVM, "", ""),
		Fixture:   []manager.Call{mcall(manager.VerbStop, MgrSrcVM, "", "")},
		Recovery:  []manager.Call{mcall(manager.VerbGC, "", "", ""), mcall(manager.VerbStart, MgrSrcVM, "", "")},
		Calibrate: []manager.Call{mcall(manager.VerbStart, MgrSrcVM, "", ""), mcall(manager.VerbStop, MgrSrcVM, "", "")}},
}

// MgrFractions are the offset cases' points in the verb's measured window
// (§15: offsets inside the window measured on the case's own stack).
var MgrFractions = []float64{0.1, 0.35, 0.6}

// MgrSupports reports whether m has every verb op's case needs up to its
// fault (a verb of the recovery it lacks is evidence, not a reason to skip).
func MgrSupports(m manager.Manager, op MgrOp) bool {
	calls := append([]manager.Call{op.Call}, op.Fixture...)
	for _, c := range append(calls, op.Calibrate...) {
		if !manager.Supported(m, c.Verb) {
			return false
		}
	}
	return true
}

// MgrOpName is a manager verb as a catalogue operation (op: label).
func MgrOpName(v manager.Verb) string { return "mgr-" + string(v) }

// ExpandManager builds the manager-verb cases of m: per verb it has, a park
// case at every VMM phase the verb passes through on m (phases, discovered
// by the runner), the offset cases, and the kill -9 of a VMM. A verb m
// lacks yields no case, never a skipped one. A verb whose discovery failed
// (failed: its error) yields one failing discover case in place of its
// park cases.
func ExpandManager(m manager.Manager, phases map[manager.Verb][]string, failed map[manager.Verb]string) []Case {
	name := m.Name()
	var out []Case
	add := func(id, title string, mc MgrCase, fault, trigger string, extra ...string) {
		mc.Manager = name
		op := MgrOpName(mc.Op.Verb)
		labels := append([]string{LayerManager, "manager:" + name, "backend:fake", "op:" + op, "fault:" + fault}, extra...)
		labels = append(labels, "case:"+CaseLabel(id))
		s := &Scenario{ID: id, Title: title, SeedRef: "manager", Op: op, Speed: "manager", Backends: []string{"fake"},
			Faults: []Fault{{Kind: fault, Trigger: trigger}}, Labels: labels, Mgr: &mc}
		out = append(out, Case{ID: id, Scenario: s, Speed: "manager", Labels: labels})
	}
	for _, op := range MgrOps {
		if !MgrSupports(m, op) {
			continue
		}
		verb := string(op.Verb)
		if why, ok := failed[op.Verb]; ok {
			add(fmt.Sprintf("mgr-%s-discover", verb),
				fmt.Sprintf("%s run unarmed on a fresh store, to find the VMM phases it passes through", verb),
				MgrCase{Manager: name, Op: op, Trigger: MgrTrigNone, DiscoverErr: why}, "none", "none", "trigger:none")
		}
		for _, p := range phases[op.Verb] {
			add(fmt.Sprintf("mgr-%s-kill-at-%s", verb, p),
				fmt.Sprintf("%s SIGKILLed while the VMM is parked at %s, then the manager's recovery", verb, p),
				MgrCase{Manager: name, Op: op, Trigger: MgrTrigPark, Point: p}, "sigkill-verb", "park "+p, "trigger:park")
			add(fmt.Sprintf("mgr-%s-kill-at-%s-then-vmm-kill9", verb, p),
				fmt.Sprintf("%s SIGKILLed while the VMM is parked at %s, then that VMM kill -9ed while the verb is dead, then the manager's recovery", verb, p),
				MgrCase{Manager: name, Op: op, Trigger: MgrTrigPark, Point: p, ThenKillVMM: true}, "sigkill-verb", "park "+p, "trigger:park", "double", "fault:sigkill-vmm")
			add(fmt.Sprintf("mgr-%s-vmm-kill9-at-%s", verb, p),
				fmt.Sprintf("the VMM kill -9ed while parked at %s with %s waiting on it alive: the verb ends, then the manager's recovery", p, verb),
				MgrCase{Manager: name, Op: op, Trigger: MgrTrigPark, Point: p, VMMOnly: true}, "sigkill-vmm", "park "+p, "trigger:park")
			mgrMatrixPark(add, m, op, p)
			mgrWorkloadPark(add, m, op, p)
		}
		for _, f := range MgrFractions {
			pct := int(f*100 + 0.5)
			add(fmt.Sprintf("mgr-%s-kill-at-%d%%", verb, pct),
				fmt.Sprintf("%s SIGKILLed %d%% into its measured window, then the manager's recovery", verb, pct),
				MgrCase{Manager: name, Op: op, Trigger: MgrTrigOffset, Fraction: f}, "sigkill-verb", fmt.Sprintf("%s start + %d%%", verb, pct), "trigger:offset")
			mgrMatrixOffset(add, m, op, f)
		}
	}
	for i := range MgrRaces {
		r := &MgrRaces[i]
		if !MgrSupports(m, r.Op) || !manager.Supported(m, r.Racer.Verb) || !slices.Contains(phases[r.Op.Verb], r.Point) {
			continue // a race the manager cannot run is not generated
		}
		add("mgr-race-"+r.Name, r.Why, MgrCase{Manager: name, Op: r.Op, Trigger: MgrTrigRace, Point: r.Point, Race: r},
			"race", "park "+r.Point+" + "+string(r.Racer.Verb), "trigger:park", "race")
	}
	start := MgrOp{Verb: manager.VerbStart, Recovery: []manager.Call{mcall(manager.VerbStart, MgrSrcVM, "", "")}}
	add("mgr-vmm-kill9", "kill -9 of a running VM's VMM: the event stream reports it, `start` brings it back",
		MgrCase{Manager: name, Op: start, Trigger: MgrTrigKillVMM}, "sigkill-vmm", "now", "trigger:now")
	return out
}

// CaseLabel makes an id usable as a case: label ('%' written "pct", one
// alphabet with the agent catalogue's labels).
func CaseLabel(id string) string { return strings.ReplaceAll(id, "%", "pct") }

// WantsManager reports whether a label filter asks for manager-verb cases
// (then, without --manager, against the bundled vmctl).
func WantsManager(filter string) bool {
	return strings.Contains(filter, LayerManager) || strings.Contains(filter, "case:mgr-") || strings.Contains(filter, "op:mgr-")
}
