package injector

import (
	"context"

	"github.com/vmchaos/vmchaos/failpoint"
)

// FaultRegistryRestart is `systemctl restart` of the case's OCI registry:
// SIGTERM, the server's graceful shutdown, a new process on the same
// address and storage.
const FaultRegistryRestart = "registry-restart"

// registryRestart is restart aimed at the registry's unit.
type registryRestart struct{ restartKind }

func (registryRestart) Name() string { return FaultRegistryRestart }
func (registryRestart) Describe() string {
	return "systemctl restart of the OCI registry's unit (stop semantics, then start)"
}
func (registryRestart) Available(h Host) error { return supervisorAvailable(FaultRegistryRestart, h) }
func (registryRestart) Landed() string {
	return "the registry's restart returned without error while the agent was parked at (or had last reached) the intended phase of its push or pull"
}

func (registryRestart) Inject(ctx context.Context, t Target) (int64, error) {
	if t.Sup == nil {
		return 0, errNoSupervisor(FaultRegistryRestart)
	}
	now := failpoint.Now()
	return now, t.Sup.Restart(ctx, t.Unit)
}
