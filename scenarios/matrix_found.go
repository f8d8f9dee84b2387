package scenarios

import "time"

// matrixFound are the product bugs the generated matrix found, each as the
// hand-written case that now guards it (with its regress switch); the
// matrix case that found it is folded into it.
var matrixFound = []Scenario{
	{
		// Found by mx-wake-snapshot-rm-tombstoned-sigkill-vmm: the VMM
		// died after the wake's readiness check, while the agent removed
		// the local snapshot; the watcher ignored the death (an operation
		// owned the VM) and the wake wrote ready over a dead VMM. The park
		// is held until the watcher reported the death, so the event
		// always arrives while the wake is in flight.
		ID: "mx-found-wake-vmm-death-in-flight", SeedRef: "matrix", Op: OpWake, Speed: "slow",
		Title: "kill -9 of the VMM while a wake removes its local snapshot (after the readiness check): the watcher's death event arrives mid-operation and the agent must still verify and restart the VM once the wake is over",
		Setup: hibernated,
		Act:   []Step{{Kind: StepWake, VM: vmA}},
		Faults: []Fault{{Kind: "sigkill-vmm", Trigger: "park snapshot.rm.tombstoned", VM: vmA,
			ReleaseAfter: "agent.child.vm-died"}},
		Env:     Env{RestartDelay: 1 * time.Second},
		Labels:  []string{"trigger:park", "matrix-found"},
		Targets: []string{"died-in-flight-dropped"},
	},
}
