package reports

import (
	"fmt"
	"sort"
	"strings"
)

// AcceptSet is `report gate --accept`: the known findings a gate lets
// through (issue #32 item 5, docs/architecture.md §12). A finding is a CASE:INVARIANT pair, so a
// new invariant failing inside an accepted case still fails the gate; a
// bare case id (the older form) accepts every invariant of that case and
// is kept only for compatibility (ParseAccept warns about it).
type AcceptSet struct {
	// Pairs maps a case id to the invariants accepted as failing in it.
	Pairs map[string]map[string]bool
	// Cases holds bare case ids: any failure of that case is accepted.
	Cases map[string]bool
}

// ParseAccept reads accept entries ("CASE:INVARIANT", or a bare "CASE")
// into a set. It returns one warning per bare case id. Case ids hold no
// ':' (scenario id, "@" and an offset), so the entry splits at its last
// ':'; an entry with an empty side is an error.
func ParseAccept(entries []string) (AcceptSet, []string, error) {
	a := AcceptSet{Pairs: map[string]map[string]bool{}, Cases: map[string]bool{}}
	var warnings []string
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		i := strings.LastIndexByte(e, ':')
		if i < 0 {
			if !a.Cases[e] {
				warnings = append(warnings, fmt.Sprintf("warning: --accept %s: a bare case id accepts any invariant failing in it, including a new one; name the finding as %s:INVARIANT", e, e))
			}
			a.Cases[e] = true
			continue
		}
		id, inv := strings.TrimSpace(e[:i]), strings.TrimSpace(e[i+1:])
		if id == "" || inv == "" {
			return AcceptSet{}, nil, fmt.Errorf("--accept %q: want CASE:INVARIANT (or a bare CASE)", e)
		}
		if a.Pairs[id] == nil {
			a.Pairs[id] = map[string]bool{}
		}
		a.Pairs[id][inv] = true
	}
	return a, warnings, nil
}

// Empty: nothing is accepted.
func (a AcceptSet) Empty() bool { return len(a.Pairs) == 0 && len(a.Cases) == 0 }

// Names says whether the set names case id at all (bare or in a pair).
func (a AcceptSet) Names(id string) bool { return a.Cases[id] || len(a.Pairs[id]) > 0 }

// Covers says whether the failure of c is entirely accepted, and lists the
// failed invariants that are not. A bare id covers any failure of its
// case; pairs cover a failure only when every violated invariant is
// accepted, and a failure that names no invariant is never covered by
// pairs (there is nothing to match it against).
func (a AcceptSet) Covers(c Case) (bool, []string) {
	if a.Cases[c.ID] {
		return true, nil
	}
	pairs := a.Pairs[c.ID]
	var unaccepted []string
	failed := 0
	for _, inv := range c.Invariants {
		if inv.OK {
			continue
		}
		failed++
		if !pairs[inv.Name] {
			unaccepted = append(unaccepted, inv.Name)
		}
	}
	if failed == 0 {
		return false, []string{"(no invariant named: " + oneLine(orDefault(c.Reason, "failed")) + ")"}
	}
	return len(unaccepted) == 0, unaccepted
}

// Stale lists the accepted pairs of c that no longer fail in it (the
// finding was fixed or moved): candidates to drop from the accept list.
func (a AcceptSet) Stale(c Case) []string {
	failing := map[string]bool{}
	for _, inv := range c.Invariants {
		if !inv.OK {
			failing[inv.Name] = true
		}
	}
	var out []string
	for inv := range a.Pairs[c.ID] {
		if !failing[inv] {
			out = append(out, c.ID+":"+inv)
		}
	}
	sort.Strings(out)
	return out
}
