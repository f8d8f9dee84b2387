package injector

import (
	"context"
	"syscall"

	"github.com/vmchaos/vmchaos/failpoint"
)

// FaultKillAll is `systemctl kill --kill-who=all -s KILL`: every process of
// the unit, its children included.
const FaultKillAll = "kill-all"

type killAll struct{ kindBase }

func (killAll) Name() string { return FaultKillAll }
func (killAll) Describe() string {
	return "systemctl kill --kill-who=all -s KILL: every process of the unit at once, children included"
}
func (killAll) Available(h Host) error { return supervisorAvailable(FaultKillAll, h) }
func (killAll) Landed() string {
	return "the kill returned without error, and the last phase the hitting process had reached when it was issued is the intended one"
}

func (killAll) traits() traits { return traits{unit: true, supervisor: true} }

// Inject stamps the moment the kill is asked (see stopKind.Inject).
func (killAll) Inject(ctx context.Context, t Target) (int64, error) {
	if t.Sup == nil {
		return 0, errNoSupervisor(FaultKillAll)
	}
	now := failpoint.Now()
	return now, t.Sup.KillAll(ctx, t.Unit, syscall.SIGKILL)
}
