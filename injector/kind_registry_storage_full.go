package injector

import (
	"context"
	"fmt"

	"github.com/vmchaos/vmchaos/failpoint"
)

// FaultRegistryStorageFull fills the file system the case's OCI registry
// keeps its blobs and manifests on: every write the registry makes (an
// upload's first file, a blob's data, a manifest) fails with ENOSPC and the
// distribution server answers 500, until the injector heals it
// Fault.StopFor later (0: it stays full). The registry process is not
// touched: it serves reads all along.
const FaultRegistryStorageFull = "registry-storage-full"

// Disk is a file system the harness can fill and heal: the registry's
// storage on a tmpfs of its own (scenarios/stack, RegistryDisk). It is
// declared here, as Node is, so that the kind sits in FaultKinds while the
// mount stays the stack's; the runner hands it over in Options.Disk.
type Disk interface {
	// Fill leaves no free block: from its return on, a write that needs
	// one fails with ENOSPC.
	Fill(ctx context.Context) error
	// Heal gives the room back.
	Heal(ctx context.Context) error
}

type registryStorageFull struct{ kindBase }

func (registryStorageFull) Name() string { return FaultRegistryStorageFull }
func (registryStorageFull) Describe() string {
	return "the OCI registry's storage file system filled (ENOSPC on every write); healed after StopFor (0: it stays full)"
}

// Available needs the registry's storage on a file system the harness
// owns: the host's own disk is not the harness's to fill.
func (registryStorageFull) Available(h Host) error {
	if h.Disk == nil {
		return fmt.Errorf("%s: needs the registry's storage on a file system of its own (the stack's tmpfs; root)", FaultRegistryStorageFull)
	}
	return nil
}

func (registryStorageFull) Landed() string {
	return "the registry's storage was full (Fill returned) while the agent was parked at (or had last reached) the intended phase of its push"
}

// traits: aimed at the registry's unit (its storage), no process signalled.
func (registryStorageFull) traits() traits { return traits{unit: true, disk: true} }

// Inject fills the disk; the stamp is the moment it is full.
func (registryStorageFull) Inject(ctx context.Context, t Target) (int64, error) {
	if t.Disk == nil {
		return 0, fmt.Errorf("%s: no disk in the target", FaultRegistryStorageFull)
	}
	err := t.Disk.Fill(ctx)
	return failpoint.Now(), err
}

// afterSignal schedules the heal StopFor after the disk filled.
func (registryStorageFull) afterSignal(in *Injector, f Fault, _ Proc, actualNs int64) {
	if f.StopFor > 0 && in.opt.Disk != nil {
		in.healLater(in.opt.Disk, actualNs+int64(f.StopFor))
	}
}
