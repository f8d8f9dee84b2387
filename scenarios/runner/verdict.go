package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/reports"
)

// culprit is who failed when a step of a case failed. The verdict follows
// from it (docs/scenarios.md, "Verdicts"): a broken product is a fail, never
// "nothing proven".
type culprit int

const (
	// byHarness: vmchaos itself broke — the stack it builds, its
	// supervisor, its own vmctl runs, a file it writes. Verdict error.
	byHarness culprit = iota
	// byProduct: the stack under test (agent, manager) missed a goal within
	// its budget, before or after the fault, or stopped serving. Fail.
	byProduct
	// byPrecondition: the host lacks what the case needs. Inconclusive.
	byPrecondition
	// byLanding: the fault could not be placed in, or did not land in, its
	// window. Inconclusive.
	byLanding
)

func (c culprit) String() string {
	switch c {
	case byProduct:
		return "product"
	case byPrecondition:
		return "precondition"
	case byLanding:
		return "landing"
	}
	return "harness"
}

// caseError is a step error with who failed and, for the product, the
// evidence a reader needs (the agent's last log lines, its unit's status).
type caseError struct {
	who       culprit
	invariant string // product: the invariant it violates (goal-reached, served-after-restart)
	err       error
	evidence  string
}

func (e *caseError) Error() string { return e.err.Error() }
func (e *caseError) Unwrap() error { return e.err }

func productErr(invariant string, err error) error {
	return &caseError{who: byProduct, invariant: invariant, err: err}
}

func harnessErr(err error) error { return &caseError{who: byHarness, err: err} }

func landingErr(err error) error { return &caseError{who: byLanding, err: err} }

// culpritOf is who an error blames: a caseError says so; an error without a
// classification is the harness's (it did not know what happened).
func culpritOf(err error) culprit {
	var ce *caseError
	if errors.As(err, &ce) {
		return ce.who
	}
	return byHarness
}

// Invariants of the product a step error can break.
const (
	GoalReached         = "goal-reached"          // an intent reached its goal within budget (setup, act, after steps)
	ServedAfterRestart  = "served-after-restart"  // the agent answered its API again after a restart
	NoUnexpectedRestart = "no-unexpected-restart" // the agent unit restarted only for the injected faults
	// OperationProgressed: the operation reached the phase its fault waits
	// for within its budget, or reached its goal another way (stall.go).
	OperationProgressed = "operation-progressed"
)

// outcome is everything a case's verdict is decided from.
type outcome struct {
	Err         error    // the first phase error (classified by caseError)
	Refusal     string   // refused before it ran: its window is too short at this scale
	NotLanded   []string // faults that missed their windows, each naming the phase it hit
	Invariants  []reports.Invariant
	Converged   bool
	Certain     string // why convergence stopped before its budget: the verdict was certain (failfast.go)
	Budget      time.Duration
	TeardownErr error
}

// verdict is the one verdict function; its table is in docs/scenarios.md.
// Order matters: a product that broke is a fail whatever else happened
// (proof of a bug); a harness error makes the case untrustworthy; a fault
// that missed its window or a refused case proves nothing; then the
// invariants decide.
func verdict(o outcome) (string, string) {
	v, reason, _ := verdictOf(o)
	return v, reason
}

// verdictOf is verdict with who the verdict blames (reports.Case.Culprit):
// "" for a pass.
func verdictOf(o outcome) (v, reason, who string) {
	v, reason, who = judgeOutcome(o)
	if o.TeardownErr != nil {
		switch v {
		case reports.Pass, reports.Inconclusive:
			// processes left behind: the harness did not clean up
			return reports.Error, "teardown: " + o.TeardownErr.Error(), byHarness.String()
		default:
			reason += "; teardown: " + o.TeardownErr.Error()
		}
	}
	return v, reason, who
}

func judgeOutcome(o outcome) (string, string, string) {
	if o.Err != nil {
		who := culpritOf(o.Err)
		if errors.Is(o.Err, context.Canceled) {
			who = byHarness // the run was interrupted
		}
		switch who {
		case byProduct:
			return reports.Fail, "product: " + o.Err.Error(), who.String()
		case byPrecondition:
			return reports.Inconclusive, "precondition: " + o.Err.Error(), who.String()
		case byLanding:
			return reports.Inconclusive, "fault did not land as intended: " + o.Err.Error(), who.String()
		default:
			return reports.Error, "harness: " + o.Err.Error(), who.String()
		}
	}
	if o.Refusal != "" {
		return reports.Inconclusive, o.Refusal, byLanding.String()
	}
	if len(o.NotLanded) > 0 {
		return reports.Inconclusive, "fault did not land as intended: " + strings.Join(o.NotLanded, "; "), byLanding.String()
	}
	return judgeInvariants(o)
}

// judgeInvariants: any violated invariant is a fail, unless every violated
// one failed only because the harness's own read failed (HarnessError):
// then nothing is proven, a harness error; or only because the failure it
// judges never happened (NotExercised): inconclusive, like a fault that
// missed its window. Nothing checked is never a pass.
func judgeInvariants(o outcome) (string, string, string) {
	var bad, unread, untested []string
	for _, inv := range o.Invariants {
		switch {
		case inv.OK:
		case inv.HarnessError:
			unread = append(unread, inv.Name)
		case inv.NotExercised:
			untested = append(untested, inv.Name+": "+inv.Evidence)
		default:
			bad = append(bad, inv.Name)
		}
	}
	if len(bad) > 0 {
		r := "violated: " + strings.Join(bad, ", ")
		if len(unread) > 0 {
			r += "; unread: " + strings.Join(unread, ", ")
		}
		switch {
		case o.Certain != "":
			r += " (" + o.Certain + ")"
		case !o.Converged:
			r += fmt.Sprintf(" (not converged within %s)", o.Budget)
		}
		// which layer broke, e.g. [manager: no-orphan-vmm; agent: intent-goal]
		r += " [" + reports.AttributeLayers(slices.Clone(o.Invariants)) + "]"
		return reports.Fail, r, byProduct.String()
	}
	if len(unread) > 0 {
		return reports.Error, "harness: the harness could not read the evidence of " + strings.Join(unread, ", "), byHarness.String()
	}
	if len(untested) > 0 {
		return reports.Inconclusive, "fault landed, path not exercised: " + strings.Join(untested, "; "), byLanding.String()
	}
	if len(o.Invariants) == 0 {
		// nothing was checked: never a pass
		return reports.Error, "harness: the case checked no invariant", byHarness.String()
	}
	return reports.Pass, "", ""
}
