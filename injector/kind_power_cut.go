package injector

import (
	"context"
	"errors"
	"fmt"

	"github.com/vmchaos/vmchaos/failpoint"
)

// FaultPowerCut is the power cut of the whole node (issue #22): every
// process of the stack stopped and killed at once, every write that was not
// durable lost, then a reboot (the units start again, the agent's startup
// convergence runs).
const FaultPowerCut = "power-cut"

// Node is a node whose power can be cut: powercut.Node, the stack's durable
// dirs on lazy filesystems. It is declared here, and the power-cut kind with
// it, so that every kind sits in the one list (FaultKinds) while the lazy
// filesystems stay out of the injector: powercut imports injector, never the
// reverse, and the runner hands its node over in Target.Node.
type Node interface {
	// Cut freezes procs, drops every write not durable, remounts what
	// survived and empties the volatile dirs, then kills procs and waits
	// for them to be gone.
	Cut(ctx context.Context, procs []Proc) error
}

// ErrNodeFault is a power cut asked of an Injector: it arms faults on units
// and processes, while a power cut is fired by the runner on the whole node.
var ErrNodeFault = errors.New("power-cut is the whole node's: the runner fires it on its powercut.Node, an Injector does not arm it")

type powerCut struct{ kindBase }

func (powerCut) Name() string { return FaultPowerCut }
func (powerCut) Describe() string {
	return "power cut of the node: every process frozen and killed at once, every write not durable lost, then a reboot"
}

// Available needs the stack on lazy filesystems (a FUSE host, as root):
// without them there is nothing to lose but processes.
func (powerCut) Available(h Host) error {
	if h.Node == nil {
		return fmt.Errorf("%s: needs the stack's durable dirs on lazy filesystems (powercut.MountIn: FUSE and root)", FaultPowerCut)
	}
	return nil
}

func (powerCut) Landed() string {
	return "the cut completed (every process of the node died) inside the fault's window: the last phase the trigger's process reached is in it"
}

// traits: no unit, no one victim; the node's processes come in the target.
func (powerCut) traits() traits { return traits{node: true} }

// Inject cuts the node's power over t.Procs; the stamp is the freeze's.
func (powerCut) Inject(ctx context.Context, t Target) (int64, error) {
	if t.Node == nil {
		return 0, fmt.Errorf("%s: no node on lazy filesystems in the target", FaultPowerCut)
	}
	now := failpoint.Now()
	return now, t.Node.Cut(ctx, t.Procs)
}

// FaultKindPowerCut is the power-cut kind, for the runner that fires it on
// its node.
var FaultKindPowerCut FaultKind = powerCut{}
