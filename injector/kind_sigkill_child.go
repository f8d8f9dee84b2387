package injector

import (
	"context"
	"syscall"
)

// FaultSigkillChild kills the agent's in-flight vmctl child: the one the
// trigger hit names (agent.child.exec), else the latest exec'd child that
// has not exited; Fault.Child and Fault.VM narrow it.
const FaultSigkillChild = "sigkill-child"

type sigkillChild struct{ kindBase }

func (sigkillChild) Name() string { return FaultSigkillChild }
func (sigkillChild) Describe() string {
	return "SIGKILL to the agent's in-flight vmctl child (pid from agent.child.exec; Child and VM narrow it)"
}
func (sigkillChild) Available(h Host) error { return signalAvailable(FaultSigkillChild, h) }
func (sigkillChild) Landed() string {
	return "the SIGKILL was delivered to an in-flight child of the asked kind, and the last phase it reached before it died is the intended one"
}

func (sigkillChild) traits() traits {
	return traits{signal: syscall.SIGKILL, unit: true, rule: victimChild, kills: true}
}

func (sigkillChild) Inject(_ context.Context, t Target) (int64, error) {
	return signalTarget(FaultSigkillChild, t, syscall.SIGKILL)
}
