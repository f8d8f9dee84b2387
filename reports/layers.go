package reports

import (
	"sort"
	"strings"
)

// Layers a failed invariant is attributed to (docs/reports.md): the one
// whose state the invariant judges. A case over a manager the user brings
// thus says whether the manager broke (its store, its VMMs, its outputs)
// or the agent did (its intents, its recovery, its API and metrics).
const (
	LayerManager = "manager" // the VM manager: records, VMMs, snapshots, its verbs and event stream
	LayerAgent   = "agent"   // the node agent: intents, recovery, API, metrics, events
	// LayerGuestData: what the guest wrote and acked, lost or torn on the
	// way through agent, manager and VMM together; the other failed
	// invariants of the case say which layer let it go.
	LayerGuestData = "guest-data"
	LayerHarness   = "harness" // the fault's own landing
	LayerStack     = "stack"   // the stack as a whole (converged and stayed so)
)

// invariantLayers maps every invariant name to its layer. A name missing
// here is reported as unattributed, never guessed (TestEveryInvariantHasALayer).
var invariantLayers = map[string]string{
	// the manager's store, VMMs and verbs
	"one-vm-per-name": LayerManager, "no-orphan-creating": LayerManager, "no-orphan-vmm": LayerManager,
	"no-running-with-dead-vmm": LayerManager, "no-paused-running": LayerManager, "no-pending-without-lease": LayerManager,
	"no-tombstone": LayerManager, "indexes-consistent": LayerManager, "no-vmctl-child": LayerManager,
	"no-leftover-sockets": LayerManager, "no-leftover-staging": LayerManager, "no-unreferenced-dirs": LayerManager,
	"no-leftover-temp-dirs": LayerManager, "unrelated-snapshots-untouched": LayerManager, "records-have-data": LayerManager,
	"records-have-data-after-cut": LayerManager, "vm-data": LayerManager, "device-tree-consistent": LayerManager,
	"mac-kept": LayerManager, "save-rejected-before-capture": LayerManager, "recovery-verb-succeeds": LayerManager,
	"name-freed-by-recovery": LayerManager, "vmm-death-seen": LayerManager, "events-match-state": LayerManager,
	"manager-setup": LayerManager, "manager-calibration": LayerManager, "manager-event-stream": LayerManager,
	"manager-listed": LayerManager, "racer-held-off": LayerManager, "verb-ends-when-vmm-dies": LayerManager, "raced-verb-succeeds": LayerManager,
	"acked-verbs-kept": LayerManager, "boots-after-cut": LayerManager, "verb-ends-after-thaw": LayerManager,
	"thawed-verb-result-holds": LayerManager,
	// the agent's intents, recovery and what it shows outside the node
	"intent-goal": LayerAgent, "vms-adopted": LayerAgent, "acked-intents-kept": LayerAgent,
	"post-clone-marker-bound": LayerAgent, "metrics-monotonic": LayerAgent, "metric-expectations": LayerAgent,
	"events-observed": LayerAgent, "no-failed-write": LayerAgent, "failed-left-by-itself": LayerAgent,
	"image-guard": LayerAgent, "fail-closed": LayerAgent,
	"cluster-one-live-vm": LayerAgent, "migrate-source-durable": LayerAgent, "no-fresh-boot-over-hibernate": LayerAgent, "wedge-visible": LayerAgent,
	"evidence-lookups-counted": LayerAgent, "resume-claim-exclusion": LayerAgent, "served-after-restart": LayerAgent,
	"no-unexpected-restart": LayerAgent, "operation-progressed": LayerAgent, "goal-reached": LayerAgent,
	// the guest's data
	"ledger-clean": LayerGuestData, "workload-consistent-cut": LayerGuestData,
	// the run itself
	"fault-landed": LayerHarness, "converged-and-stable": LayerStack,
}

// LayerOf is the layer of invariant name, "" when none is known.
func LayerOf(name string) string { return invariantLayers[name] }

// AttributeLayers sets Layer on every failed invariant (unattributed where
// the name has none) and returns the failed ones grouped by layer, e.g.
// "manager: no-orphan-vmm, no-paused-running; agent: intent-goal".
func AttributeLayers(invs []Invariant) string {
	by := map[string][]string{}
	for i := range invs {
		if invs[i].OK {
			continue
		}
		l := LayerOf(invs[i].Name)
		switch {
		case invs[i].HarnessError:
			l = LayerHarness // the harness could not read the evidence
		case l == "":
			l = "unattributed"
		}
		invs[i].Layer = l
		by[l] = append(by[l], invs[i].Name)
	}
	layers := make([]string, 0, len(by))
	for l := range by {
		layers = append(layers, l)
	}
	order := map[string]int{LayerManager: 0, LayerAgent: 1, LayerGuestData: 2, LayerStack: 3, LayerHarness: 4}
	sort.Slice(layers, func(i, j int) bool {
		oi, iok := order[layers[i]]
		oj, jok := order[layers[j]]
		if iok != jok {
			return iok
		}
		if oi != oj {
			return oi < oj
		}
		return layers[i] < layers[j]
	})
	parts := make([]string, 0, len(layers))
	for _, l := range layers {
		parts = append(parts, l+": "+strings.Join(by[l], ", "))
	}
	return strings.Join(parts, "; ")
}
