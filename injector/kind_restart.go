package injector

import (
	"context"

	"github.com/vmchaos/vmchaos/failpoint"
)

// FaultRestart is `systemctl restart` of the unit (stop semantics, then
// start).
const FaultRestart = "restart"

type restartKind struct{ kindBase }

func (restartKind) Name() string { return FaultRestart }
func (restartKind) Describe() string {
	return "systemctl restart of the unit (stop semantics, then start)"
}
func (restartKind) Available(h Host) error { return supervisorAvailable(FaultRestart, h) }
func (restartKind) Landed() string {
	return "the restart returned without error, and the last phase the hitting process had reached when it was issued is the intended one"
}

func (restartKind) traits() traits { return traits{unit: true, supervisor: true} }

// Inject stamps the moment the restart is asked (see stopKind.Inject).
func (restartKind) Inject(ctx context.Context, t Target) (int64, error) {
	if t.Sup == nil {
		return 0, errNoSupervisor(FaultRestart)
	}
	now := failpoint.Now()
	return now, t.Sup.Restart(ctx, t.Unit)
}
