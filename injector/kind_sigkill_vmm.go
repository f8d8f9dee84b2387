package injector

import (
	"context"
	"syscall"
)

// FaultSigkillVMM kills a VM's cloud-hypervisor process: Fault.VM's, else
// the VM of the trigger hit.
const FaultSigkillVMM = "sigkill-vmm"

type sigkillVMM struct{ kindBase }

func (sigkillVMM) Name() string { return FaultSigkillVMM }
func (sigkillVMM) Describe() string {
	return "SIGKILL to the VM's VMM (Fault.VM, else the trigger hit's vm), found by its argv and api.sock"
}
func (sigkillVMM) Available(h Host) error { return signalAvailable(FaultSigkillVMM, h) }
func (sigkillVMM) Landed() string {
	return "the SIGKILL was delivered to the VM's VMM, and the last phase the hitting process reached before it is the intended one"
}

func (sigkillVMM) traits() traits {
	return traits{signal: syscall.SIGKILL, rule: victimVMM, kills: true}
}

func (sigkillVMM) Inject(_ context.Context, t Target) (int64, error) {
	return signalTarget(FaultSigkillVMM, t, syscall.SIGKILL)
}
