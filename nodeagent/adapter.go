package nodeagent

import (
	"context"
	"fmt"

	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/manager/cocoon"
	mvmctl "github.com/vmchaos/vmchaos/manager/vmctl"
)

// Manager adapters the agent can drive (--manager). vmctl, the bundled
// manager, is the default; an empty Config.Manager means it.
const (
	ManagerVMCtl  = "vmctl"
	ManagerCocoon = "cocoon"
)

// validManager checks --manager.
func validManager(name string) error {
	switch name {
	case "", ManagerVMCtl, ManagerCocoon:
		// Whether the binary has what the agent needs is the plan's to say
		// at start (managerPlan), from the binary's own capability table.
		return nil
	}
	return fmt.Errorf("--manager %q: want %s or %s", name, ManagerVMCtl, ManagerCocoon)
}

// agentAdapter is what the agent uses of an adapter: its argv per verb, its
// capability table (through manager.CapabilitiesOf), its typed refusals and
// the decoders of its read verbs.
type agentAdapter = manager.Embedder

// adapter is the manager adapter of --manager for --manager-bin: the agent
// learns a child's outcome only through it (manager.Classifier, issue 33
// item 1, docs/architecture.md §14), never by matching the child's text.
func (a *Agent) adapter() agentAdapter {
	o := manager.Options{Bin: a.cfg.VMCtl}
	if a.cfg.Manager == ManagerCocoon {
		return cocoon.New(o)
	}
	return mvmctl.New(o)
}

// call runs one catalogue verb with the argv the adapter builds for it
// (manager.Manager.Command), as a tracked child like every other (vmctl).
// For vmctl the argv is the one the agent always ran.
func (a *Agent) call(ctx context.Context, vm string, c manager.Call) (childOutput, error) {
	argv, err := a.adapter().Command(c)
	if err != nil {
		return childOutput{}, fmt.Errorf("%s: %w", c, err)
	}
	if len(argv) == 0 || argv[0] != a.cfg.VMCtl {
		return childOutput{}, fmt.Errorf("%s: the adapter's argv %q does not run %s", c, argv, a.cfg.VMCtl)
	}
	return a.vmctl(ctx, vm, argv[1:]...)
}
