package injector

import (
	"context"
	"syscall"
)

// FaultSigstop freezes the unit's main process; SIGCONT follows after
// Fault.StopFor (0: it stays stopped, for a later sigcont).
const FaultSigstop = "sigstop"

type sigstopKind struct{ kindBase }

func (sigstopKind) Name() string { return FaultSigstop }
func (sigstopKind) Describe() string {
	return "SIGSTOP to the unit's main process; SIGCONT after StopFor (0: it stays stopped)"
}
func (sigstopKind) Available(h Host) error { return signalAvailable(FaultSigstop, h) }
func (sigstopKind) Landed() string {
	return "the SIGSTOP was delivered to the main process read at Arm, and the last phase it reached before it froze is the intended one"
}

func (sigstopKind) traits() traits {
	return traits{signal: syscall.SIGSTOP, unit: true, rule: victimMain}
}

func (sigstopKind) Inject(_ context.Context, t Target) (int64, error) {
	return signalTarget(FaultSigstop, t, syscall.SIGSTOP)
}

// afterSignal schedules the SIGCONT StopFor after the stop (a frozen
// process, not a dead one: the supervisor sees nothing).
func (sigstopKind) afterSignal(in *Injector, f Fault, p Proc, actualNs int64) {
	if f.StopFor > 0 {
		in.contLater(p, actualNs+int64(f.StopFor))
	}
}
