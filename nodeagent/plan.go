package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

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
	// Refused are the missing rows no plan replaces (needed): the agent
	// does not start over such a manager, and says which and why.
	Refused []manager.Capability `json:"refused,omitempty"`
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
	// What an embedder without a guest channel does: trust the manager's
	// own state, re-read after the clone (vk-cocoon's readiness is cocoon's
	// `running`).
	insteadNoGuestExec = "readiness is the manager's own state: the VM is ready when `inspect` lists it running after the clone " +
		"(no command answered by the guest; no DHCP release before a hibernate)"
	insteadNoStale = "a `creating` record whose owner died is not recovered: the operation fails closed with this reason " +
		"(the manager's own gc is the only collector)"
)

var insteadOf = map[string]string{
	manager.FeatureNIC:               insteadNoNIC,
	manager.FeatureGuestExec:         insteadNoGuestExec,
	string(manager.VerbRecoverStale): insteadNoStale,
}

// needed are the rows the agent has no plan without: every operation
// clones, starts, inspects, lists, saves or removes; the watcher is the
// event stream; hibernate pushes an export and wake imports it.
var needed = []string{
	string(manager.VerbClone), string(manager.VerbSnapshotSave), string(manager.VerbSnapshotRm),
	string(manager.VerbStart), string(manager.VerbRm), manager.FeatureInspect, manager.FeatureListJSON,
	manager.FeatureEvents, manager.FeatureExport, manager.FeatureImport,
}

// newPlan derives the plan from a capability table. A needed row the table
// lacks (or does not report: an unknown is never a yes) is refused.
func newPlan(c manager.Capabilities) *Plan {
	p := &Plan{Manager: c.Manager, Version: c.Version, Missing: c.Missing()}
	for _, m := range p.Missing {
		if s, ok := insteadOf[m.Name]; ok {
			p.Instead = append(p.Instead, PlanStep{Capability: m.Name, Instead: s})
		}
	}
	for _, n := range needed {
		if ok, why := c.Supports(n); !ok {
			p.Refused = append(p.Refused, manager.Capability{Name: n, Reason: strings.TrimPrefix(why, manager.NotSupportedPrefix)})
		}
	}
	return p
}

// refusal is why the agent cannot run over the plan's manager (nil when it
// can).
func (p *Plan) refusal() error {
	if p == nil || len(p.Refused) == 0 {
		return nil
	}
	var why []string
	for _, r := range p.Refused {
		why = append(why, r.Reason)
	}
	return fmt.Errorf("--manager %s: the agent needs what this manager lacks, and no plan replaces it: %s",
		p.Manager, strings.Join(why, "; "))
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
	if err := p.refusal(); err != nil {
		return nil, err // recorded in PlanFile first, so the reason is on disk too
	}
	for _, s := range p.Instead {
		a.log.Warn("manager lacks a capability; planning around it", "manager", p.Manager, "capability", s.Capability, "instead", s.Instead)
	}
	return p, nil
}
