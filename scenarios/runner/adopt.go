package runner

import (
	"context"
	"fmt"

	"github.com/vmchaos/vmchaos/scenarios/checker"
)

// vms-adopted (Expect.Adopted) compares the VMs after the restart with a
// baseline taken before the fault, never after it: a VM the restarted agent
// already recreated would otherwise be its own baseline. The baseline is
// listed at arm time and again in a park, before a parked fault is injected
// (the operation may have made the VM in between); a list that fails is
// recorded and fails the invariant, and so does an empty baseline
// (checker.Input.AdoptedErr, AdoptedIDs).

// listBaseline lists every VM now into the baseline (called from the park's
// goroutine too, hence the lock).
func (cr *caseRun) listBaseline(ctx context.Context) {
	vms, err := cr.st.ListVMs(ctx)
	cr.mu.Lock()
	defer cr.mu.Unlock()
	if err != nil {
		if cr.adoptErr == nil {
			cr.adoptErr = fmt.Errorf("vm list before the fault: %w", err)
		}
		return
	}
	if cr.preFault == nil {
		cr.preFault = map[string]string{}
	}
	for _, v := range vms {
		cr.preFault[v.Name] = v.ID
	}
}

// adoptBaseline keeps, of the baseline, the VMs of intents that must end
// ready: those the restarted agent must adopt as they were. It is never
// nil, so vms-adopted is judged (checker.Evidence.Asked) even when it is
// empty.
func (cr *caseRun) adoptBaseline() {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	cr.adopted = map[string]string{}
	for name, id := range cr.preFault {
		if cr.goals[name] == checker.GoalReady {
			cr.adopted[name] = id
		}
	}
}
