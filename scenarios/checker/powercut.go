package checker

import (
	"fmt"
	"sort"

	"github.com/vmchaos/vmchaos/manager"
	agentapi "github.com/vmchaos/vmchaos/nodeagent/api"
	"github.com/vmchaos/vmchaos/reports"
)

// Invariants of a power cut (issue #22): what a node must keep when every
// write it never made durable is lost.
const (
	// AckedIntentsKept: every intent change the agent acknowledged (2xx)
	// before the cut is what the rebooted agent lists.
	AckedIntentsKept = "acked-intents-kept"
	// RecordsHaveData: no VM or snapshot record points at data that is
	// gone (read from the manager's check: vm-data, snapshot-data).
	RecordsHaveData = "records-have-data"
	// CheckVMData is the manager check's name for a VM record without its
	// disk (vmctl check).
	CheckVMData = "vm-data"
)

// Polled with the other state invariants in every case: a record without its
// data is never a converged state, power cut or not.
func init() {
	State = append(State, StateInvariant{RecordsHaveData,
		"no VM record past creating without its disk, no ready snapshot without its files (read from the manager's check)",
		[]Source{SrcCheck}, needCheckReport, fromCheck(CheckVMData, manager.CheckSnapshotData)})
}

// Ack is one intent change the agent acknowledged with a 2xx.
type Ack struct {
	Name       string
	Generation int64 // the generation the agent reported after it (0: unknown)
	Delete     bool
	// Released: the node released the VM to the control plane (a
	// migration's source, answered): the record must stay hibernated
	// until the agent deletes it, never run again here
	Released bool
	AtNs     int64 // CLOCK_MONOTONIC when the 2xx was received
}

// AckedIntentsKeptInvariant judges what the rebooted agent lists (listed,
// read before it could act on anything new) against the last change of
// every name acknowledged before cutNs: a PUT must be there, not deleted,
// at its generation or later; a DELETE must be gone or still deleting; a
// release (Ack.Released) must be hibernated, deleting or gone.
// listErr (the list could not be read) fails it: no data, no pass.
func AckedIntentsKeptInvariant(acks []Ack, cutNs int64, listed []agentapi.VMView, listErr error) reports.Invariant {
	inv := reports.Invariant{Name: AckedIntentsKept}
	if listErr != nil {
		inv.Evidence = fmt.Sprintf("the rebooted agent's intents could not be listed: %v", listErr)
		return inv
	}
	last := map[string]Ack{}
	for _, a := range acks {
		if a.AtNs < cutNs {
			last[a.Name] = a
		}
	}
	views := map[string]agentapi.VMView{}
	for _, v := range listed {
		views[v.Name] = v
	}
	names := make([]string, 0, len(last))
	for n := range last {
		names = append(names, n)
	}
	sort.Strings(names)
	var ev []string
	for _, n := range names {
		a, v := last[n], views[n]
		_, present := views[n]
		switch {
		case a.Released && present && !v.Deleted && v.Status.Lifecycle != agentapi.LifecycleHibernated &&
			v.Status.Lifecycle != agentapi.LifecycleDeleting:
			ev = append(ev, fmt.Sprintf("%s: released to the control plane before the cut, the agent lists it %s (generation %d)", n, v.Status.Lifecycle, v.Generation))
		case a.Released:
			// kept hibernated, being deleted or gone: what a release allows
		case a.Delete && present && !v.Deleted:
			ev = append(ev, fmt.Sprintf("%s: DELETE acknowledged before the cut, the agent lists it live (generation %d)", n, v.Generation))
		case a.Delete:
		case !present:
			ev = append(ev, fmt.Sprintf("%s: PUT acknowledged before the cut (generation %d), the rebooted agent does not know it", n, a.Generation))
		case v.Deleted:
			ev = append(ev, fmt.Sprintf("%s: PUT acknowledged before the cut, the agent lists it deleted", n))
		case v.Generation < a.Generation:
			ev = append(ev, fmt.Sprintf("%s: generation %d acknowledged before the cut, the agent lists %d", n, a.Generation, v.Generation))
		}
	}
	if len(names) == 0 {
		// nothing acknowledged before the cut: nothing to keep, nothing proven
		ev = append(ev, fmt.Sprintf("no intent change acknowledged before the cut (%d ack(s) in all): nothing proven", len(acks)))
	}
	inv.OK = len(ev) == 0
	if inv.OK {
		inv.Evidence = fmt.Sprintf("%d intent change(s) acknowledged before the cut, all kept: %v", len(names), names)
	} else {
		inv.Evidence = fmt.Sprint(ev)
	}
	return inv
}
