package manager

import (
	"errors"
	"fmt"
)

// Outcome is a kind of refusal an embedder branches on (issue 33 item 1,
// docs/architecture.md §14, docs/manager.md "Typed outcomes"). Each adapter
// maps its own manager's messages to one; the embedder (the bundled agent,
// docs/architecture.md §6) branches on the Outcome and never on a string.
type Outcome string

// The outcomes. A refusal that is none of them is no *Refusal: the embedder
// treats it as a plain failure.
const (
	// OutcomeNameHeld: the name of the VM or snapshot to create is held by
	// another record (Refusal.Holder, Refusal.Pending).
	OutcomeNameHeld Outcome = "name-held"
	// OutcomeLeaseHeld: a live reader (a clone, restore, export) holds the
	// snapshot; the refusal clears when that process ends.
	OutcomeLeaseHeld Outcome = "lease-held"
	// OutcomePaused: the VM's VMM is paused by a capture in flight.
	OutcomePaused Outcome = "paused"
	// OutcomeNotFound: the VM or snapshot named does not exist.
	OutcomeNotFound Outcome = "not-found"
	// OutcomeBusy: another operation holds the object; retry later.
	OutcomeBusy Outcome = "busy"
	// OutcomeEjectPending: a NIC change waits for the guest to release an
	// unplugged device; running the change again waits again.
	OutcomeEjectPending Outcome = "eject-pending"
)

// Objects a Refusal is about.
const (
	ObjectVM       = "vm"
	ObjectSnapshot = "snapshot"
)

// Refusal is a manager's refusal of a verb, typed by its adapter.
type Refusal struct {
	Outcome Outcome
	// Object is ObjectVM or ObjectSnapshot; "" when the message does not say.
	Object string
	// Name is the name the message names ("" when it names none).
	Name string
	// Holder is the ID of the record holding the name (OutcomeNameHeld);
	// "" when the manager does not print it (cocoon's finished snapshot),
	// and the embedder must look the name up.
	Holder string
	// Pending: the holder is a record not yet committed, e.g. one left by a
	// killed save (seed 001 #3), as opposed to a finished one.
	Pending bool
	// Message is the manager's own message, for logs.
	Message string
}

func (r *Refusal) Error() string {
	s := fmt.Sprintf("%s %s", r.Object, r.Outcome)
	if r.Holder != "" {
		s += " by " + r.Holder
	}
	if r.Pending {
		s += " (pending)"
	}
	return s + ": " + r.Message
}

// Classifier is an adapter that types its manager's refusals. Classify
// reads a failed verb's stderr and returns the typed refusal, or nil when
// the output is no outcome an embedder branches on.
type Classifier interface {
	Classify(stderr string) *Refusal
}

// RefusalOf returns the typed refusal in err's chain.
func RefusalOf(err error) (*Refusal, bool) {
	var r *Refusal
	if errors.As(err, &r) && r != nil {
		return r, true
	}
	return nil, false
}

// Is reports whether err carries a refusal of outcome o.
func Is(err error, o Outcome) bool {
	r, ok := RefusalOf(err)
	return ok && r.Outcome == o
}
