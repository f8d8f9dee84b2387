package runner

import (
	"strings"

	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// PlanFaults is case c's fault plan as this runner arms it: each fault with
// its trigger as runCase passes it to the injector (triggerString: the
// scaled offset appended), its park point, victim and release rule. It is
// the fault plan of the run's schedule (reports.Schedule, issue #36).
func (r *Runner) PlanFaults(c scenarios.Case) []reports.PlannedFault {
	out := make([]reports.PlannedFault, 0, len(c.Scenario.Faults))
	for i, f := range c.Scenario.Faults {
		p := reports.PlannedFault{Kind: f.Kind, Unit: f.Unit, Trigger: r.triggerString(c, i), VM: f.VM, Child: f.Child,
			Window: f.Window, ReleaseAfter: f.ReleaseAfter, ReleaseAfterChild: f.ReleaseAfterChild, StopForNs: int64(f.StopFor)}
		if pt, ok := strings.CutPrefix(f.Trigger, "park "); ok {
			p.Park = strings.TrimSpace(pt)
		}
		out = append(out, p)
	}
	return out
}

// Seed is the run's seed, which every case's stack is seeded with.
func (r *Runner) Seed() int64 { return r.opts.Seed }
