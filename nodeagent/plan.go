package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/manager"
)

// PlanFile is the state-dir file where the agent records its manager's
// missing capabilities and what it does instead (issue 33 item 2).
const PlanFile = "manager-plan.json"

// Plan is what the agent does given its manager's capability table: the
// steps an embedder would skip or replace when the manager lacks the verb
// (docs/architecture.md §6 and §14, docs/manager.md "Typed outcomes and the
// agent's plan"). A nil *Plan is the bundled vmctl's: everything present.
type Plan struct {
	Manager string `json:"manager"`
	Version string `json:"version,omitempty"`
	// Missing are the table's rows the manager lacks, each with its reason.
	Missing []manager.Capability `json:"missing,omitempty"`
	// Instead says, per missing row the agent would use, what it does
	// instead.
	Instead []PlanStep `json:"instead,omitempty"`
}

// PlanStep is one replaced step.
type PlanStep struct {
	Capability string `json:"capability"`
	Instead    string `json:"instead"`
}

// What the agent does without each capability it uses.
const (
	insteadNoNIC = "hibernate keeps the VM's NICs: no NIC drop and no DHCP release before the save " +
		"(the snapshot carries the NIC; wake does not re-add one)"
	// Not planned around yet: readiness probes run `vm exec`, so a create
	// or wake over such a manager fails at its readiness step.
	insteadNoGuestExec = "nothing yet: readiness probes need it, so creates and wakes fail at their readiness step"
	insteadNoStale     = "a `creating` record whose owner died is not recovered: the operation fails closed with this reason " +
		"(the manager's own gc is the only collector)"
)

var insteadOf = map[string]string{
	manager.FeatureNIC:               insteadNoNIC,
	manager.FeatureGuestExec:         insteadNoGuestExec,
	string(manager.VerbRecoverStale): insteadNoStale,
}

// newPlan derives the plan from a capability table.
func newPlan(c manager.Capabilities) *Plan {
	p := &Plan{Manager: c.Manager, Version: c.Version, Missing: c.Missing()}
	for _, m := range p.Missing {
		if s, ok := insteadOf[m.Name]; ok {
			p.Instead = append(p.Instead, PlanStep{Capability: m.Name, Instead: s})
		}
	}
	return p
}

// has reports whether the manager has row name, and the reason when not.
// A nil plan (vmctl, the default) has every row.
func (p *Plan) has(name string) (bool, string) {
	if p == nil {
		return true, ""
	}
	for _, m := range p.Missing {
		if m.Name == name {
			return false, m.Reason
		}
	}
	return true, ""
}

// managerPlan reads the capability table of the agent's manager through its
// adapter (manager.CapabilitiesOf) and records the plan in the state dir.
func (a *Agent) managerPlan(ctx context.Context) (*Plan, error) {
	c, err := manager.CapabilitiesOf(ctx, a.adapter())
	if err != nil {
		return nil, err
	}
	p := newPlan(c)
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("manager plan: %w", err)
	}
	if err := durable.WriteFile(filepath.Join(a.cfg.StateDir, PlanFile), b, 0o644); err != nil {
		return nil, fmt.Errorf("record manager plan: %w", err)
	}
	for _, s := range p.Instead {
		a.log.Warn("manager lacks a capability; planning around it", "manager", p.Manager, "capability", s.Capability, "instead", s.Instead)
	}
	return p, nil
}
