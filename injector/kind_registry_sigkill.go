package injector

import (
	"context"
	"syscall"
)

// FaultRegistrySigkill kills the main process of the case's OCI registry
// (the distribution server) as a crash would; its unit's Restart=always
// brings it back after RestartSec, on the same address and storage. The
// agent is not touched: a push or pull in flight meets a dead registry.
const FaultRegistrySigkill = "registry-sigkill"

// registrySigkill is sigkill-main aimed at the registry's unit: the same
// delivery (pidfd of the main pid read at Arm), its own name, so that a
// registry fault never counts as an agent restart.
type registrySigkill struct{ sigkillMain }

func (registrySigkill) Name() string { return FaultRegistrySigkill }
func (registrySigkill) Describe() string {
	return "SIGKILL to the OCI registry's main process (Fault.Unit is the registry's unit; Restart=always restarts it)"
}
func (registrySigkill) Available(h Host) error { return signalAvailable(FaultRegistrySigkill, h) }
func (registrySigkill) Landed() string {
	return "the SIGKILL was delivered to the registry's main process while the agent was parked at (or had last reached) the intended phase of its push or pull"
}

func (registrySigkill) Inject(_ context.Context, t Target) (int64, error) {
	return signalTarget(FaultRegistrySigkill, t, syscall.SIGKILL)
}
