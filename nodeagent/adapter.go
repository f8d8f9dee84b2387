package nodeagent

import (
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
		return nil
	}
	return fmt.Errorf("--manager %q: want %s or %s", name, ManagerVMCtl, ManagerCocoon)
}

// adapter is the manager adapter of --manager for --manager-bin: the agent
// learns a child's outcome only through it (manager.Classifier, issue 33
// item 1, docs/architecture.md §14), never by matching the child's text.
func (a *Agent) adapter() manager.Classifier {
	o := manager.Options{Bin: a.cfg.VMCtl}
	if a.cfg.Manager == ManagerCocoon {
		return cocoon.New(o)
	}
	return mvmctl.New(o)
}
