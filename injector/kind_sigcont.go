package injector

import (
	"context"
	"syscall"
)

// FaultSigcont resumes the unit's main process (after a sigstop that had
// no StopFor).
const FaultSigcont = "sigcont"

type sigcontKind struct{ kindBase }

func (sigcontKind) Name() string { return FaultSigcont }
func (sigcontKind) Describe() string {
	return "SIGCONT to the unit's main process (the end of a sigstop without StopFor)"
}
func (sigcontKind) Available(h Host) error { return signalAvailable(FaultSigcont, h) }
func (sigcontKind) Landed() string {
	return "the SIGCONT was delivered to the main process read at Arm, and the last phase it had reached is the intended one"
}

func (sigcontKind) traits() traits {
	return traits{signal: syscall.SIGCONT, unit: true, rule: victimMain}
}

func (sigcontKind) Inject(_ context.Context, t Target) (int64, error) {
	return signalTarget(FaultSigcont, t, syscall.SIGCONT)
}
