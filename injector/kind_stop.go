package injector

import (
	"context"
	"fmt"

	"github.com/vmchaos/vmchaos/failpoint"
)

// FaultStop is `systemctl stop` of the unit (SIGTERM to the main process
// only, SIGKILL after TimeoutStopSec, no restart); `systemctl start` follows
// after Fault.StopFor (0: it stays stopped).
const FaultStop = "stop"

type stopKind struct{ kindBase }

func (stopKind) Name() string { return FaultStop }
func (stopKind) Describe() string {
	return "systemctl stop of the unit; systemctl start after StopFor (0: it stays stopped)"
}
func (stopKind) Available(h Host) error { return supervisorAvailable(FaultStop, h) }
func (stopKind) Landed() string {
	return "the stop returned without error (and the start after StopFor too), and the last phase the hitting process had reached when the stop was issued is the intended one"
}

func (stopKind) traits() traits { return traits{unit: true, supervisor: true} }

// Inject stamps the moment the stop is asked: the unit's main process gets
// its SIGTERM during the call, which returns once it is gone.
func (stopKind) Inject(ctx context.Context, t Target) (int64, error) {
	if t.Sup == nil {
		return 0, errNoSupervisor(FaultStop)
	}
	now := failpoint.Now()
	return now, t.Sup.Stop(ctx, t.Unit)
}

// afterSettle starts the unit again StopFor after the landing was read.
func (stopKind) afterSettle(ctx context.Context, in *Injector, f Fault) (int64, error) {
	if f.StopFor <= 0 {
		return 0, nil
	}
	_ = sleepUntil(ctx, failpoint.Now()+int64(f.StopFor))
	resumed := failpoint.Now()
	if err := in.sup.StartAgain(ctx, f.Unit); err != nil {
		return resumed, fmt.Errorf("start after stop: %w", err)
	}
	return resumed, nil
}
