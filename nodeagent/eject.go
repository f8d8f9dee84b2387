package nodeagent

import (
	"context"

	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/timescale"
)

// ejectRetries bounds how often a NIC change is re-run while the guest has
// not acked an unplug; each run waits vmctl's own eject budget.
const ejectRetries = 3

func isEjectPending(err error) bool { return manager.Is(err, manager.OutcomeEjectPending) }

// netNICs runs `vm net VM --nics n`. CH keeps an unplugged NIC in its device
// tree until the guest acks the eject, and vmctl refuses to go on ("eject
// pending") rather than let a save carry the half-gone NIC or an add collide
// on its id. A slow guest is waited for by re-running the verb, which waits
// for the same devices again (vmctl keeps their ids); a guest that never
// acks fails the operation with that reason, and the failed-state retry
// starts again from the NIC change.
func (a *Agent) netNICs(ctx context.Context, name, vmID string, n int) error {
	for attempt := 1; ; attempt++ {
		_, err := a.call(ctx, name, manager.Call{Verb: manager.VerbNIC, VM: vmID, NICs: &n})
		if err == nil || !isEjectPending(err) || attempt >= ejectRetries {
			return err
		}
		a.log.Warn("NIC change: eject pending, running it again", "vm", name, "attempt", attempt, "err", err)
		if err := timescale.SleepRaw(ctx, a.cfg.ReadyTick); err != nil {
			return err
		}
	}
}
