package injector

import (
	"context"
	"syscall"
)

// FaultSigkillHitter SIGKILLs the process whose hit fired the trigger (the
// runner's sigkill-direct: a vmctl the harness started itself); Allow or
// Resolve decides whether that process may be killed.
const FaultSigkillHitter = "sigkill-hitter"

type sigkillHitter struct{ kindBase }

func (sigkillHitter) Name() string { return FaultSigkillHitter }
func (sigkillHitter) Describe() string {
	return "SIGKILL to the process whose hit fired the trigger, once Allow or Resolve vouched for it"
}
func (sigkillHitter) Available(h Host) error { return signalAvailable(FaultSigkillHitter, h) }
func (sigkillHitter) Landed() string {
	return "the SIGKILL was delivered to the process that hit the trigger point, and the last phase it reached before it died is the intended one"
}

func (sigkillHitter) traits() traits {
	return traits{signal: syscall.SIGKILL, rule: victimHitter, kills: true}
}

func (sigkillHitter) Inject(_ context.Context, t Target) (int64, error) {
	return signalTarget(FaultSigkillHitter, t, syscall.SIGKILL)
}
