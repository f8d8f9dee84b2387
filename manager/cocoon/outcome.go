package cocoon

import (
	"regexp"
	"strings"

	"github.com/vmchaos/vmchaos/manager"
)

var _ manager.Classifier = (*Adapter)(nil)

// cocoon's refusals (docs/manager.md, "Error strings an embedder branches
// on"; paths in github.com/cocoonstack/cocoon):
//   - `VM name %q already exists (id: %s)` v0.2.7-1 hypervisor/cloudhypervisor/utils.go,
//     `vm name %q already exists (id: %s)` v0.3.0 and HEAD hypervisor/backend.go;
//   - `snapshot name %q already exists` cmd/snapshot/handler.go, the pre-check
//     that sees finished records: no holder ID is printed;
//   - `snapshot name %q already in use by %s` snapshot/localfile/localfile.go
//     Create (and import.go): the index names a record the pre-check did not
//     see, i.e. a pending one left by a killed save (seed 001 #3);
//   - `VM not found` hypervisor/hypervisor.go ErrNotFound, `snapshot not
//     found` snapshot/db.go ErrNotFound;
//   - `gc aborted: modules skipped (lock busy)` gc/orchestrator.go;
//   - `InvalidStateTransition(Paused, ...)`: cloud-hypervisor's own refusal,
//     which cocoon passes through, of a VMM a dead capture left Paused.
//
// cocoon has no snapshot lease, so nothing maps to OutcomeLeaseHeld.
var (
	reVMName     = regexp.MustCompile(`(?:VM|vm) name "([^"]*)" already exists \(id: ([A-Za-z0-9]+)\)`)
	reSnapExists = regexp.MustCompile(`snapshot name "([^"]*)" already exists`)
	reSnapInUse  = regexp.MustCompile(`snapshot name "([^"]*)" already in use by ([A-Za-z0-9]+)`)
	rePaused     = regexp.MustCompile(`InvalidStateTransition\(Paused\b`)
)

// Classify types a failed cocoon's stderr (manager.Classifier). cocoon logs
// every step to stderr and prints its error last, so the whole output is
// searched.
func (a *Adapter) Classify(stderr string) *manager.Refusal { return Classify(stderr) }

// Classify is the adapter's Classifier without an adapter.
func Classify(stderr string) *manager.Refusal {
	ref := func(o manager.Outcome, obj string) *manager.Refusal {
		return &manager.Refusal{Outcome: o, Object: obj, Message: lastLines(stderr, 1)}
	}
	if m := reSnapInUse.FindStringSubmatch(stderr); m != nil {
		r := ref(manager.OutcomeNameHeld, manager.ObjectSnapshot)
		r.Name, r.Holder, r.Pending = m[1], m[2], true
		return r
	}
	if m := reSnapExists.FindStringSubmatch(stderr); m != nil {
		r := ref(manager.OutcomeNameHeld, manager.ObjectSnapshot)
		r.Name = m[1]
		return r
	}
	if m := reVMName.FindStringSubmatch(stderr); m != nil {
		r := ref(manager.OutcomeNameHeld, manager.ObjectVM)
		r.Name, r.Holder = m[1], m[2]
		return r
	}
	switch {
	case strings.Contains(stderr, "VM not found"):
		return ref(manager.OutcomeNotFound, manager.ObjectVM)
	case strings.Contains(stderr, "snapshot not found"):
		return ref(manager.OutcomeNotFound, manager.ObjectSnapshot)
	case strings.Contains(stderr, "(lock busy)"):
		return ref(manager.OutcomeBusy, "")
	case rePaused.MatchString(stderr):
		return ref(manager.OutcomePaused, manager.ObjectVM)
	}
	return nil
}
