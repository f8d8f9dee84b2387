package injector

import (
	"context"
	"fmt"

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
	return "the registry's restart returned without error while the agent was parked at (or had last reached) the intended phase of its push or pull; with the agent parked, the restart's stop and start returned, the agent released between them"
}

// Inject is one `systemctl restart`, or with t.Between (the agent parked
// at a phase of its push or pull) a stop, Between (the agent released, on
// its way to the stopped registry) and a start: the restart's down time
// stretched over the agent's next request, so that the request meets it
// whatever the load.
func (registryRestart) Inject(ctx context.Context, t Target) (int64, error) {
	if t.Sup == nil {
		return 0, errNoSupervisor(FaultRegistryRestart)
	}
	now := failpoint.Now()
	if t.Between == nil {
		return now, t.Sup.Restart(ctx, t.Unit)
	}
	if err := t.Sup.Stop(ctx, t.Unit); err != nil {
		return now, fmt.Errorf("restart's stop: %w", err)
	}
	t.Between(ctx)
	if err := t.Sup.StartAgain(ctx, t.Unit); err != nil {
		return now, fmt.Errorf("restart's start: %w", err)
	}
	return now, nil
}
