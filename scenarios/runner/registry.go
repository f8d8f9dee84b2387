package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/nodeagent"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/checker"
	"github.com/vmchaos/vmchaos/scenarios/stack"
)

// registryPrecondition: a real-registry case needs the distribution server
// on this host, and one that fills the registry's storage needs root (its
// tmpfs); without them the case is inconclusive with the reason.
func registryPrecondition(s *scenarios.Scenario) error {
	if s.Env.Registry != scenarios.RegistryOCI {
		return nil
	}
	if hasFault(s, injector.FaultRegistryStorageFull) && os.Geteuid() != 0 {
		return fmt.Errorf("%s: the registry's storage goes on a tmpfs of its own, which needs root", injector.FaultRegistryStorageFull)
	}
	return stack.RegistryAvailable()
}

// registryStep runs the harness steps of the real-registry cases; ok is
// false for a step kind that is not one of them.
func (cr *caseRun) registryStep(ctx context.Context, step scenarios.Step, budget time.Duration) (ok bool, err error) {
	switch step.Kind {
	case scenarios.StepDropLocal:
		// a node that never held the snapshot: only the registry has it
		if _, err := cr.st.Vmctl(ctx, "snapshot", "rm", step.VM); err != nil {
			return true, harnessErr(fmt.Errorf("drop the local snapshot %s: %w", step.VM, err))
		}
		return true, nil
	case scenarios.StepForgetRecord:
		// the agent stopped: a node that never saw the VM has no record
		if err := os.Remove(filepath.Join(cr.st.State, "vms", step.VM+".json")); err != nil {
			return true, harnessErr(fmt.Errorf("forget the agent's record of %s: %w", step.VM, err))
		}
		return true, nil
	case scenarios.StepWakeImage:
		return true, cr.wakeImage(ctx, step)
	case scenarios.StepExpectImageRefused:
		return true, cr.expectRefused(ctx, step.VM, budget, refusal{reason: "image_changed", text: "refusing to restore it into another image",
			invariant: checker.ImageGuard, what: "restored a hibernate snapshot into an image it was not taken from"})
	case scenarios.StepExpectFreshBootRefused:
		return true, cr.expectRefused(ctx, step.VM, budget, refusal{reason: "evidence", text: "(refusing fresh boot)", parked: true,
			invariant: checker.FailClosed, what: "did not fail closed while its hibernate evidence could not be read"})
	}
	return false, nil
}

// wakeImage imports Step.Image (the base image under a new name, as a new
// release of the image would be) and puts the intent {Image, ready}.
func (cr *caseRun) wakeImage(ctx context.Context, step scenarios.Step) error {
	if _, err := cr.st.Vmctl(ctx, "snapshot", "inspect", step.Image); err != nil {
		if _, err := cr.st.Vmctl(ctx, "snapshot", "import", "--name", step.Image, cr.r.run.BaseExport); err != nil {
			return harnessErr(fmt.Errorf("import image %s: %w", step.Image, err))
		}
	}
	return cr.put(ctx, step.VM, nodeagent.Intent{Snapshot: step.Image})
}

// refusal is what a fail-closed refusal must look like on the agent's API.
type refusal struct {
	reason    string // Status.FailedReason
	text      string // in Status.Message
	parked    bool   // automatic retries exhausted (the budget)
	invariant string // what a VM, a ready or a timeout violates
	what      string // the violation in words
}

// expectRefused waits until the agent reports name failed with the
// refusal's reason (and, parked, its retries exhausted) while no VM of the
// name exists; a VM of the name, a ready lifecycle, or no refusal within
// budget violates the refusal's invariant. Then it waits for the registry
// to answer again (a fault that froze it healed) so the case's next step
// meets a healed registry.
func (cr *caseRun) expectRefused(ctx context.Context, name string, budget time.Duration, r refusal) error {
	deadline := time.Now().Add(budget)
	var last string
	for {
		v, err := cr.st.Agent.Get(ctx, name)
		vm, exists, lerr := cr.st.VMByName(ctx, name)
		switch {
		case err != nil || lerr != nil:
			last = fmt.Sprint(errors.Join(err, lerr))
		case exists:
			return productErr(r.invariant, fmt.Errorf("the agent %s: vm %s (%s) of %s exists (agent: %s %s %q)",
				r.what, vm.ID, vm.State, name, v.Status.Lifecycle, v.Status.FailedReason, v.Status.Message))
		case v.Status.Lifecycle == nodeagent.LifecycleReady:
			return productErr(r.invariant, fmt.Errorf("the agent %s: %s is ready", r.what, name))
		case v.Status.Lifecycle == nodeagent.LifecycleFailed && v.Status.FailedReason == r.reason &&
			strings.Contains(v.Status.Message, r.text) && (!r.parked || strings.Contains(v.Status.Message, "retries exhausted")):
			return cr.registryHealed(ctx, budget)
		default:
			last = fmt.Sprintf("%s %s %q", v.Status.Lifecycle, v.Status.FailedReason, v.Status.Message)
		}
		if time.Now().After(deadline) {
			return productErr(r.invariant, fmt.Errorf("%s: no %s refusal (reason %s, %q) within %s (last: %s)", name, r.invariant, r.reason, r.text, budget, last))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// registryHealed waits until the case's registry answers /v2/ again.
func (cr *caseRun) registryHealed(ctx context.Context, budget time.Duration) error {
	if cr.st.RegistryURL == "" {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	if err := cr.st.WaitRegistry(wctx); err != nil {
		return harnessErr(fmt.Errorf("the registry did not heal: %w", err))
	}
	return nil
}
