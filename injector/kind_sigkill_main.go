package injector

import (
	"context"
	"syscall"
)

// FaultSigkillMain kills the unit's main process as a crash or the OOM
// killer would: Restart=always starts it again after RestartSec.
const FaultSigkillMain = "sigkill-main"

type sigkillMain struct{ kindBase }

func (sigkillMain) Name() string { return FaultSigkillMain }
func (sigkillMain) Describe() string {
	return "SIGKILL to the unit's main process, as a crash or the OOM killer would (Restart=always restarts it)"
}
func (sigkillMain) Available(h Host) error { return signalAvailable(FaultSigkillMain, h) }
func (sigkillMain) Landed() string {
	return "the SIGKILL was delivered to the main process read at Arm, and the last phase it reached before it died is the intended one"
}

func (sigkillMain) traits() traits {
	return traits{signal: syscall.SIGKILL, unit: true, rule: victimMain, kills: true}
}

func (sigkillMain) Inject(_ context.Context, t Target) (int64, error) {
	return signalTarget(FaultSigkillMain, t, syscall.SIGKILL)
}
