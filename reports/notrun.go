package reports

import (
	"fmt"
	"sort"
	"strings"
)

// What a not-run case lacks (NotRun.Kind).
const (
	MissingBinary      = "binary"       // a program the case runs (cloud-hypervisor, a manager binary)
	MissingHostFeature = "host-feature" // a kernel or device feature (/dev/kvm, /dev/fuse)
	MissingCapability  = "capability"   // a privilege the harness lacks (root for a FUSE mount)
	// MissingManagerVerb: a verb or feature the manager under test lacks
	// (Results.NotSupported; its cases are not generated, never passed).
	MissingManagerVerb = "manager-verb"
)

// NotRun is a case the runner selected but could not run because the host
// lacks a binary or a feature it needs. The case keeps its verdict
// (inconclusive, culprit precondition: docs/scenarios.md); this entry says
// by name that it was never judged, so nobody reads it as covered
// (issue 31, "Skips say so").
type NotRun struct {
	Case    string `json:"case"`    // the case id
	Reason  string `json:"reason"`  // the precondition's words, as the case's reason
	Missing string `json:"missing"` // what is missing: "cloud-hypervisor", "/dev/kvm", "FUSE"
	Kind    string `json:"kind"`    // MissingBinary | MissingHostFeature | MissingCapability
}

// NotRunIDs is the set of case ids listed as not run.
func (r *Results) NotRunIDs() map[string]bool {
	ids := make(map[string]bool, len(r.NotRun))
	for _, n := range r.NotRun {
		ids[n.Case] = true
	}
	return ids
}

// NotRunSummary is the "N not run (reasons…)" phrase of a run's summary:
// the count and each distinct missing thing with how many cases it kept
// from running; "" when every selected case ran.
func NotRunSummary(list []NotRun) string {
	if len(list) == 0 {
		return ""
	}
	byWhat := map[string]int{}
	for _, n := range list {
		byWhat[notRunWhat(n)]++
	}
	whats := make([]string, 0, len(byWhat))
	for w := range byWhat {
		whats = append(whats, w)
	}
	sort.Strings(whats)
	parts := make([]string, len(whats))
	for i, w := range whats {
		parts[i] = fmt.Sprintf("%s ×%d", w, byWhat[w])
	}
	return fmt.Sprintf("%d not run (%s)", len(list), strings.Join(parts, "; "))
}

// notRunWhat names what a not-run case lacks, with its kind.
func notRunWhat(n NotRun) string {
	return fmt.Sprintf("missing %s %s", orDefault(n.Kind, "precondition"), orDefault(n.Missing, "?"))
}
