package ledger

import (
	"fmt"
	"sort"
	"strings"
)

// Verdict is the ledger outcome for one guest after a wake.
type Verdict struct {
	Guest         string
	Stable        int      // acked and present
	Lost          int      // acked and missing: data loss
	InFlight      int      // intent only: either outcome is allowed
	Phantom       int      // present but never journaled
	Inherited     int      // present and journaled for another guest (a clone of its snapshot) or retired by Forget: allowed
	LostNames     []string `json:",omitempty"`
	PhantomNames  []string `json:",omitempty"`
	InFlightNames []string `json:",omitempty"`
	RAMMissing    []string `json:",omitempty"` // RAM markers acked under the baseline boot id and gone
	RAMChecked    bool     // the verification asked for RAM markers and boot id
	BootIDBefore  string   `json:",omitempty"` // journaled baseline
	BootIDAfter   string   `json:",omitempty"` // boot id the guest reported now
	BootIDChanged bool
	ColdBootNote  string `json:",omitempty"` // why a boot id change was accepted
	OK            bool
	Message       string
}

// Observed is what the guest showed when it was listed.
type Observed struct {
	Disk     []string // names in DiskDir
	RAM      []string // names in RAMDir (only when CheckRAM)
	BootID   string   // current boot id (only when CheckRAM)
	CheckRAM bool
	// ColdBootAllowed: reason a boot id change is legitimate (VerifyOpts).
	ColdBootAllowed string
}

// markerState folds a marker's journal entries.
type markerState struct {
	guest  string
	acked  bool
	bootID string
}

// Classify turns the journal and one listing of guest into a verdict:
//   - acked and present → stable; acked and missing → LOST (fails);
//   - intent only → in-flight (present or not, both are fine: the runner
//     died or the guest failed between intent and ack);
//   - present but never journaled → PHANTOM (fails): something other than
//     the ledger wrote there, or the journal lost a line it had fsynced;
//   - with CheckRAM, the boot id must equal the baseline (the guest's latest
//     journaled boot id, from RecordBootID or the last ack) and every marker
//     acked under that boot id must still be in RAM; otherwise the wake
//     booted fresh over the hibernate snapshot (fails);
//   - no acked marker of the guest at all proves nothing (fails): a guest
//     verified against an empty history would pass whatever it lost.
func Classify(guest string, entries []Entry, obs Observed) Verdict {
	v := Verdict{Guest: guest, RAMChecked: obs.CheckRAM}
	markers, order, baseline := foldJournal(guest, entries)
	v.classifyMarkers(markers, order, baseline, obs)
	if obs.CheckRAM {
		v.BootIDBefore = baseline
		v.BootIDAfter = obs.BootID
		v.BootIDChanged = baseline != "" && obs.BootID != baseline
	}
	ramOK := len(v.RAMMissing) == 0 && !v.BootIDChanged
	if v.BootIDChanged && obs.ColdBootAllowed != "" {
		// The markers a legitimate cold boot took are expected gone.
		ramOK = true
		v.ColdBootNote = obs.ColdBootAllowed
	}
	v.OK = v.Stable+v.Lost > 0 && v.Lost == 0 && v.Phantom == 0 && ramOK
	v.Message = v.message()
	return v
}

// foldJournal folds the journal into every marker's state (in first-seen
// order) and guest's boot id baseline: its latest journaled boot id, reset
// by a Forget of the guest.
func foldJournal(guest string, entries []Entry) (markers map[string]*markerState, order []string, baseline string) {
	markers = map[string]*markerState{}
	for _, e := range entries {
		switch e.Kind {
		case KindForget:
			if e.Guest == guest {
				// Earlier markers of the guest stay known (not
				// phantom) but are owned by the retired machine.
				for _, st := range markers {
					if st.guest == guest {
						st.guest = ""
					}
				}
				baseline = ""
			}
		case KindIntent, KindAcked:
			st := markers[e.Marker]
			if st == nil {
				st = &markerState{guest: e.Guest}
				markers[e.Marker] = st
				order = append(order, e.Marker)
			}
			if e.Kind == KindAcked {
				st.acked = true
				st.bootID = e.BootID
				if e.Guest == guest {
					baseline = e.BootID
				}
			}
		case KindBootID:
			if e.Guest == guest {
				baseline = e.BootID
			}
		}
	}
	return markers, order, baseline
}

// classifyMarkers counts the guest's journaled markers against the listing
// (stable, lost, in flight, RAM missing) and the listed names the journal
// does not give the guest (phantom, inherited).
func (v *Verdict) classifyMarkers(markers map[string]*markerState, order []string, baseline string, obs Observed) {
	disk := set(obs.Disk)
	ram := set(obs.RAM)
	for _, name := range order {
		st := markers[name]
		if st.guest != v.Guest {
			continue
		}
		switch {
		case st.acked && disk[name]:
			v.Stable++
		case st.acked:
			v.Lost++
			v.LostNames = append(v.LostNames, name)
		default:
			v.InFlight++
			v.InFlightNames = append(v.InFlightNames, name)
		}
		if obs.CheckRAM && st.acked && st.bootID == baseline && !ram[name] {
			v.RAMMissing = append(v.RAMMissing, name)
		}
	}
	for _, name := range sortedKeys(disk) {
		st := markers[name]
		switch {
		case st == nil:
			v.Phantom++
			v.PhantomNames = append(v.PhantomNames, name)
		case st.guest != v.Guest:
			v.Inherited++
		}
	}
}

func (v Verdict) message() string {
	var bad []string
	if v.Lost > 0 {
		bad = append(bad, fmt.Sprintf("LOST %d acked marker(s) missing from %s: %s", v.Lost, DiskDir, strings.Join(v.LostNames, ", ")))
	}
	if v.Phantom > 0 {
		bad = append(bad, fmt.Sprintf("PHANTOM %d marker(s) in %s the journal never saw: %s", v.Phantom, DiskDir, strings.Join(v.PhantomNames, ", ")))
	}
	switch {
	case v.ColdBootNote != "":
		// accepted; reported in the success line below
	case v.BootIDChanged && len(v.RAMMissing) > 0:
		bad = append(bad, fmt.Sprintf("the wake booted fresh over a hibernate snapshot: boot id changed %s → %s and %d RAM marker(s) are gone from %s: %s",
			v.BootIDBefore, v.BootIDAfter, len(v.RAMMissing), RAMDir, strings.Join(v.RAMMissing, ", ")))
	case v.BootIDChanged:
		bad = append(bad, fmt.Sprintf("the wake booted fresh over a hibernate snapshot: boot id changed %s → %s", v.BootIDBefore, v.BootIDAfter))
	case len(v.RAMMissing) > 0:
		bad = append(bad, fmt.Sprintf("guest memory not restored intact (a stale or partial memory snapshot was restored): boot id unchanged but %d RAM marker(s) are gone from %s: %s",
			len(v.RAMMissing), RAMDir, strings.Join(v.RAMMissing, ", ")))
	}
	if v.Stable+v.Lost == 0 {
		bad = append(bad, "no acked marker of the guest in the journal: nothing proven")
	}
	if len(bad) > 0 {
		return fmt.Sprintf("guest %s: %s", v.Guest, strings.Join(bad, "; "))
	}
	s := fmt.Sprintf("guest %s: %d stable, %d in-flight", v.Guest, v.Stable, v.InFlight)
	if v.Inherited > 0 {
		s += fmt.Sprintf(", %d inherited", v.Inherited)
	}
	switch {
	case v.ColdBootNote != "":
		s += fmt.Sprintf("; boot id changed %s → %s and %d RAM marker(s) went with it, accepted: %s",
			v.BootIDBefore, v.BootIDAfter, len(v.RAMMissing), v.ColdBootNote)
	case v.RAMChecked:
		s += "; RAM markers and boot id survived the wake"
	}
	return s
}

func set(names []string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
