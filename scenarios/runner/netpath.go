package runner

import (
	"errors"
	"fmt"
	"os"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/scenarios"
)

// isNetFault: the kind cuts or impairs the node's path to the registry, so
// its case runs the node and the registry in network namespaces of their
// own (stack.Options.NetPath). The injector's kinds say which they are.
func isNetFault(kind string) bool { return injector.OnLink(kind) }

// hasNetFault reports whether s has a fault on the node's path.
func hasNetFault(s *scenarios.Scenario) bool {
	for _, f := range s.Faults {
		if isNetFault(f.Kind) {
			return true
		}
	}
	return false
}

// netPrecondition: a net-fault case creates network namespaces and enters
// them, which needs root; without it the case is not run, with the reason.
func netPrecondition(s *scenarios.Scenario) error {
	if !hasNetFault(s) {
		return nil
	}
	if os.Geteuid() != 0 {
		return errors.New("net faults: the node and the registry go into network namespaces of the case, which needs root")
	}
	return nil
}

// netAvailable asks each net fault's kind whether it can run on the case's
// path (net-delay needs the kernel's netem): a kind that cannot makes the
// case not run, with the kind's reason, never passed.
func (cr *caseRun) netAvailable() error {
	if !hasNetFault(cr.s) {
		return nil
	}
	if cr.st.Net == nil {
		return errors.New("net faults: the case's stack has no net path")
	}
	for _, f := range cr.s.Faults {
		if !isNetFault(f.Kind) {
			continue
		}
		k, err := injector.LookupFaultKind(f.Kind)
		if err != nil {
			return err
		}
		if err := k.Available(injector.Host{Sup: cr.r.run.Sup, Link: cr.st.Net}); err != nil {
			return fmt.Errorf("net faults: %w", err)
		}
	}
	return nil
}
