package scenarios

import (
	"fmt"

	"github.com/vmchaos/vmchaos/manager"
)

// The manager-verb matrix beyond SIGKILL (issue 32 item 2): at every VMM
// phase a verb passes through, and at its offsets, the other fault kinds
// that apply to a verb:
//
//   - power-cut: the node's power cut (the manager's whole store on lazy
//     filesystems: records, images, the guests' disks; scenarios.FaultPowerCut);
//     after the "reboot" the embedder's boot (the manager's gc, the fixture's
//     VM started again) and its retry under the same names, judged by the
//     same state table plus what a cut must keep;
//   - sigstop-verb: the verb frozen (SIGSTOP, with its children) while its
//     VMM finishes the request, then thawed (SIGCONT): it must come back.
//
// A restart-like fault of a verb is its SIGKILL followed by the embedder's
// rerun, which every kill case already is; a verb has no unit to restart.

// Fault kinds of the matrix's cells (labels fault:<kind>).
const (
	MgrFaultPowerCut = FaultPowerCut
	MgrFaultFreeze   = "sigstop-verb"
)

// mgrMatrixFast are the representatives the nightly label leaves in
// `!speed:nightly`: one cell per new kind, at a phase every manager's verb
// passes through. Every other cell of the matrix is speed:nightly.
var mgrMatrixFast = map[string]bool{
	"mgr-clone-powercut-at-ch.restore.begin":                        true,
	"mgr-snapshot-save-freeze-at-ch.snapshot.memory-written":        true,
	"mgr-snapshot-save-kill-at-ch.snapshot.memory-written-workload": true,
}

// mgrLabels are a matrix cell's extra labels: nightly unless the cell is a
// representative.
func mgrLabels(id string, extra ...string) []string {
	if !mgrMatrixFast[id] {
		extra = append(extra, "speed:nightly")
	}
	return extra
}

type mgrAdd func(id, title string, mc MgrCase, fault, trigger string, extra ...string)

// mgrMatrixPark adds op's cells at VMM phase p: the power cut (where the
// adapter names its store's dirs) and the frozen verb.
func mgrMatrixPark(add mgrAdd, m manager.Manager, op MgrOp, p string) {
	verb := string(op.Verb)
	if _, ok := m.(manager.StoreLayout); ok {
		id := fmt.Sprintf("mgr-%s-powercut-at-%s", verb, p)
		add(id, fmt.Sprintf("power cut while %s's VMM is parked at %s (the store on lazyfs), then the boot and the retry", verb, p),
			MgrCase{Op: op, Trigger: MgrTrigPark, Point: p, PowerCut: true}, MgrFaultPowerCut, "park "+p, mgrLabels(id, "trigger:park")...)
	}
	id := fmt.Sprintf("mgr-%s-freeze-at-%s", verb, p)
	add(id, fmt.Sprintf("%s SIGSTOPped while its VMM is parked at %s, the VMM released, then SIGCONT: the verb comes back", verb, p),
		MgrCase{Op: op, Trigger: MgrTrigPark, Point: p, Freeze: true}, MgrFaultFreeze, "park "+p, mgrLabels(id, "trigger:park")...)
}

// mgrWorkloadPark adds the save's workload cell at VMM phase p (issue 32
// item 2, the live workload): the fixture's VM runs the guest writer
// through the save, the save is SIGKILLed parked at p, the embedder's
// recovery retries it under the same name, and a clone of the snapshot it
// leaves must hold exactly that save's consistent cut
// (workload-consistent-cut). Only where the adapter can give a VM a guest
// the harness reaches (a manager.GuestNet); whether this host lets it
// (cocoon: the CNI plugins, root) is the case's precondition when it runs
// (manager.GuestNetOf: inconclusive with the reason, listed in not_run),
// so a host without them still lists the cells it could not run.
func mgrWorkloadPark(add mgrAdd, m manager.Manager, op MgrOp, p string) {
	if _, ok := m.(manager.GuestNet); !ok || op.Verb != manager.VerbSnapshotSave {
		return
	}
	id := fmt.Sprintf("mgr-snapshot-save-kill-at-%s-workload", p)
	add(id, fmt.Sprintf("snapshot-save of a VM whose guest writer runs, SIGKILLed while the VMM is parked at %s, then the recovery's save under the same name: a clone of the snapshot holds exactly that save's cut", p),
		MgrCase{Op: op, Trigger: MgrTrigPark, Point: p, Workload: true}, "sigkill-verb", "park "+p, mgrLabels(id, "trigger:park", "workload")...)
}

// mgrMatrixOffset adds op's power cut at fraction f of its window.
func mgrMatrixOffset(add mgrAdd, m manager.Manager, op MgrOp, f float64) {
	if _, ok := m.(manager.StoreLayout); !ok {
		return
	}
	verb, pct := string(op.Verb), int(f*100+0.5)
	id := fmt.Sprintf("mgr-%s-powercut-at-%d%%", verb, pct)
	add(id, fmt.Sprintf("power cut %d%% into %s's measured window (the store on lazyfs), then the boot and the retry", pct, verb),
		MgrCase{Op: op, Trigger: MgrTrigOffset, Fraction: f, PowerCut: true}, MgrFaultPowerCut,
		fmt.Sprintf("%s start + %d%%", verb, pct), mgrLabels(id, "trigger:offset")...)
}

// MgrBoot is what the embedder runs when its node comes back after a power
// cut, before it retries the verb that was in flight: the manager's own
// recovery (gc), then every VM that ran before the verb started again
// (every VMM died with the node) — except the fixture's VM when the verb
// under test was deciding its fate (rm, stop, start: the retry does it).
func MgrBoot(op MgrOp, running []string) []manager.Call {
	boot := []manager.Call{mcall(manager.VerbGC, "", "", "")}
	for _, name := range running {
		if name == MgrSrcVM && (op.Verb == manager.VerbRm || op.Verb == manager.VerbStop || op.Verb == manager.VerbStart) {
			continue
		}
		boot = append(boot, mcall(manager.VerbStart, name, "", ""))
	}
	return boot
}
