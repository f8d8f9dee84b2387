package injector

import (
	"context"
	"syscall"
)

// FaultRegistrySigstop freezes the case's OCI registry; SIGCONT follows
// after Fault.StopFor. A frozen server still accepts connections (the
// kernel's backlog) and never answers: the client's timeouts are what
// this fault tests.
const FaultRegistrySigstop = "registry-sigstop"

// registrySigstop is sigstop aimed at the registry's unit (the SIGCONT
// after StopFor comes from the embedded kind's afterSignal).
type registrySigstop struct{ sigstopKind }

func (registrySigstop) Name() string { return FaultRegistrySigstop }
func (registrySigstop) Describe() string {
	return "SIGSTOP to the OCI registry's main process; SIGCONT after StopFor (0: it stays frozen)"
}
func (registrySigstop) Available(h Host) error { return signalAvailable(FaultRegistrySigstop, h) }
func (registrySigstop) Landed() string {
	return "the SIGSTOP was delivered to the registry's main process while the agent was parked at (or had last reached) the intended phase of its push or pull"
}

func (registrySigstop) Inject(_ context.Context, t Target) (int64, error) {
	return signalTarget(FaultRegistrySigstop, t, syscall.SIGSTOP)
}
