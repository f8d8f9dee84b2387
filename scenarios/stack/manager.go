package stack

import (
	"context"
	"strings"

	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/manager"
	mvmctl "github.com/vmchaos/vmchaos/manager/vmctl"
)

// ManagerObserver reads this stack's vmctl store the way the checker must:
// through the vmctl binary's JSON verbs (run like every harness vmctl, in the
// stack's pid namespace, without trace, failpoints or regress switches).
func (s *Stack) ManagerObserver() manager.Observer {
	if s.Cocoon != nil {
		// the agent drives cocoon: vmctl's store is empty, and an empty
		// list must never stand in for cocoon's
		return s.Cocoon
	}
	// the bundled vmctl has `observe`: one exec a poll instead of three
	return mvmctl.NewObserver(s.Vmctl, s.Root, s.RunDir).WithObserveVerb()
}

// GuestOf is the VM named name as the ledger reaches its guest: its id and
// guest SSH address ("" without a NIC), from the store of the stack's
// manager (vmctl's list, or cocoon's through its adapter: vmctl's store of
// an agent over cocoon is empty).
func (s *Stack) GuestOf(ctx context.Context, name string) (id, addr string, ok bool, err error) {
	if s.Cocoon == nil {
		v, ok, err := s.VMByName(ctx, name)
		return v.ID, v.GuestAddress(), ok, err
	}
	vms, err := s.Cocoon.VMs(ctx)
	if err != nil {
		return "", "", false, err
	}
	for _, v := range vms {
		if v.Name == name {
			return v.ID, v.Address, true, nil
		}
	}
	return "", "", false, nil
}

// GuestBootID reads the boot id of the guest name at addr over the ledger's
// pinned SSH connection: the proof that a ready VM's guest answers.
func (s *Stack) GuestBootID(ctx context.Context, name, addr string) (string, error) {
	out, err := s.Ledger.Exec(ctx, ledger.Guest{Name: name, Addr: addr}, "cat "+ledger.BootIDPath)
	return strings.TrimSpace(out), err
}
