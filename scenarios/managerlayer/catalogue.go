// Package managerlayer is the manager-level catalogue (docs/architecture.md §14):
// SIGKILL of a manager's verb at every fakech phase and at offsets inside
// the verb's measured window, kill -9 of the VMM, then the manager's own
// recovery (gc, its stale-create verb, the next verb), judged only from what
// the manager shows (manager.Manager) and from processes and dirs. It runs
// without nodeagent, against vmctl or a user's binary (cocoon).
package managerlayer

import (
	"fmt"
	"strings"

	"github.com/onsi/ginkgo/v2/types"

	"github.com/vmchaos/vmchaos/manager"
)

// Trigger kinds of a manager case.
const (
	TrigPark    = "park"     // fakech parks at Point (failpoint pause); the verb is killed while it waits
	TrigAt      = "at"       // the verb is killed when the VMM reports Point (trace), no pause
	TrigOffset  = "offset"   // the verb is killed Fraction of its measured window after it started
	TrigKillVMM = "kill-vmm" // kill -9 of the VMM of the fixture's VM while no verb runs
)

// Object names every case uses.
const (
	SrcVM    = "src"  // the running VM of the fixture
	BaseSnap = "base" // its snapshot
	Target   = "tgt"  // what the verb under test creates (clone: VM, save: snapshot)
)

// Op is one verb under test: the call, its VMM phases in order, the
// fixture it needs, and the manager's recovery after its verb died.
type Op struct {
	Verb manager.Verb
	Call manager.Call
	// Fixture are calls run before the fault, after `create src` and
	// `snapshot save base src`.
	Fixture []manager.Call
	// Recovery is what a user (or an agent) does next: gc, the
	// stale-create verb where the manager has one, then the verb again.
	// The last call is the retry; it must succeed.
	Recovery []manager.Call
	// Calibrate measures the verb's window on the case's own stack without
	// disturbing the fixture (offset cases).
	Calibrate []manager.Call
}

func call(v manager.Verb, vm, snap, name string) manager.Call {
	return manager.Call{Verb: v, VM: vm, Snapshot: snap, Name: name}
}

// Ops is the catalogue's data: what each verb does, what comes after it.
var Ops = []Op{
	{Verb: manager.VerbClone, Call: call(manager.VerbClone, "", BaseSnap, Target),
		Recovery:  []manager.Call{call(manager.VerbRecoverStale, Target, "", ""), call(manager.VerbGC, "", "", ""), call(manager.VerbClone, "", BaseSnap, Target)},
		Calibrate: []manager.Call{call(manager.VerbClone, "", BaseSnap, "calib")}},
	{Verb: manager.VerbSnapshotSave, Call: call(manager.VerbSnapshotSave, SrcVM, "", Target),
		// `start` is what a user tries on a VM that looks stuck; it must
		// not report success over a VM it leaves Paused (the invariants
		// look after it).
		Recovery: []manager.Call{call(manager.VerbGC, "", "", ""), call(manager.VerbStart, SrcVM, "", ""),
			call(manager.VerbSnapshotSave, SrcVM, "", Target+"-retry")},
		Calibrate: []manager.Call{call(manager.VerbSnapshotSave, SrcVM, "", "calib")}},
	{Verb: manager.VerbRestore, Call: call(manager.VerbRestore, SrcVM, BaseSnap, ""),
		Recovery:  []manager.Call{call(manager.VerbGC, "", "", ""), call(manager.VerbRestore, SrcVM, BaseSnap, "")},
		Calibrate: []manager.Call{call(manager.VerbRestore, SrcVM, BaseSnap, "")}},
	{Verb: manager.VerbRm, Call: call(manager.VerbRm, SrcVM, "", ""),
		Recovery:  []manager.Call{call(manager.VerbGC, "", "", ""), call(manager.VerbRm, SrcVM, "", "")},
		Calibrate: []manager.Call{call(manager.VerbClone, "", BaseSnap, "calib"), call(manager.VerbRm, "calib", "", "")}},
	{Verb: manager.VerbStop, Call: call(manager.VerbStop, SrcVM, "", ""),
		Recovery:  []manager.Call{call(manager.VerbGC, "", "", ""), call(manager.VerbStop, SrcVM, "", "")},
		Calibrate: []manager.Call{call(manager.VerbStop, SrcVM, "", ""), call(manager.VerbStart, SrcVM, "", "")}},
	{Verb: manager.VerbStart, Call: call(manager.VerbStart, SrcVM, "", ""),
		Fixture:   []manager.Call{call(manager.VerbStop, SrcVM, "", "")},
		Recovery:  []manager.Call{call(manager.VerbGC, "", "", ""), call(manager.VerbStart, SrcVM, "", "")},
		Calibrate: []manager.Call{call(manager.VerbStart, SrcVM, "", ""), call(manager.VerbStop, SrcVM, "", "")}},
}

// Fractions are the offset cases' points in the verb's measured window
// (§15: offsets inside the window measured on the case's own stack).
var Fractions = []float64{0.1, 0.35, 0.6}

// Case is one manager-level case.
type Case struct {
	ID       string
	Title    string
	Manager  string
	Op       Op
	Trigger  string
	Point    string  // park / at
	Fraction float64 // offset
	Labels   []string
}

// Expand builds the cases of every op the manager supports (a verb it does
// not have yields no case rather than a skipped one): a park case per VMM
// phase the verb passes through on this manager (phases, from discover),
// offset cases, and the kill -9 of the VMM.
func Expand(m manager.Manager, phases map[manager.Verb][]string) []Case {
	name := m.Name()
	var out []Case
	for _, op := range Ops {
		if !supportsAll(m, op) {
			continue
		}
		verb := string(op.Verb)
		labels := func(extra ...string) []string {
			return append([]string{"layer:manager", "manager:" + name, "backend:fake", "op:" + verb, "speed:fast"}, extra...)
		}
		for _, p := range phases[op.Verb] {
			id := fmt.Sprintf("mgr-%s-kill-at-%s", verb, p)
			out = append(out, Case{ID: id, Manager: name, Op: op, Trigger: TrigPark, Point: p,
				Title:  fmt.Sprintf("%s SIGKILLed while the VMM is parked at %s, then the manager's recovery", verb, p),
				Labels: labels("fault:sigkill-verb", "trigger:park", "case:"+id)})
		}
		for _, f := range Fractions {
			id := fmt.Sprintf("mgr-%s-kill-at-%d%%", verb, int(f*100+0.5))
			out = append(out, Case{ID: id, Manager: name, Op: op, Trigger: TrigOffset, Fraction: f,
				Title:  fmt.Sprintf("%s SIGKILLed %d%% into its measured window, then the manager's recovery", verb, int(f*100+0.5)),
				Labels: labels("fault:sigkill-verb", "trigger:offset", "case:"+caseLabel(id))})
		}
	}
	id := "mgr-vmm-kill9"
	out = append(out, Case{ID: id, Manager: name, Trigger: TrigKillVMM,
		Op:    Op{Verb: manager.VerbStart, Recovery: []manager.Call{call(manager.VerbStart, SrcVM, "", "")}},
		Title: "kill -9 of a running VM's VMM: the event stream reports it, `start` brings it back",
		Labels: []string{"layer:manager", "manager:" + name, "backend:fake", "op:start", "speed:fast",
			"fault:sigkill-vmm", "case:" + id}})
	return out
}

// caseLabel makes an id usable as a Ginkgo label ('%' is not special, but
// keep labels to one alphabet with the ids of the agent catalogue).
func caseLabel(id string) string { return strings.ReplaceAll(id, "%", "pct") }

func supportsAll(m manager.Manager, op Op) bool {
	calls := append([]manager.Call{op.Call}, op.Fixture...)
	calls = append(calls, op.Calibrate...)
	for _, c := range calls {
		if !manager.Supported(m, c.Verb) {
			return false
		}
	}
	return true
}

// Filter keeps the cases a Ginkgo label-filter expression selects.
func Filter(cases []Case, expr string) ([]Case, error) {
	if strings.TrimSpace(expr) == "" {
		return cases, nil
	}
	f, err := types.ParseLabelFilter(expr)
	if err != nil {
		return nil, fmt.Errorf("--label-filter %q: %w", expr, err)
	}
	var out []Case
	for _, c := range cases {
		if f(c.Labels) {
			out = append(out, c)
		}
	}
	return out, nil
}
