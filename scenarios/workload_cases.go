package scenarios

import "strings"

// workloadScenarios are the cases of issue #13 that exist for the guest
// workload: a direct save of a VM whose writer runs, held parked at each
// phase of the save (the park is the interference: the capture, the pause
// or the ops lock held for as long as the harness holds it). The runner
// clones each save's snapshot and judges the clone's markers as a
// consistent cut of the save's pause/resume window (workload-consistent-cut),
// so every case is also a clone of a snapshot taken under workload.
func workloadScenarios() []Scenario {
	var out []Scenario
	for _, p := range []string{"snapshot.save.locked", "snapshot.save.paused", "snapshot.save.captured", "snapshot.save.resumed"} {
		phase := strings.TrimPrefix(p, "snapshot.save.")
		out = append(out, Scenario{
			ID: "wl-save-held-" + phase, SeedRef: "gap", Op: OpSave, Speed: "fast",
			Title:    "a direct save under the guest workload, held parked at " + p + ": a clone of its snapshot holds a consistent cut of the writer's markers (every marker acked before the pause, none begun after the resume, no holes)",
			Setup:    readyA,
			Act:      []Step{{Kind: StepDirectSave, VM: vmA}},
			Faults:   []Fault{{Kind: "none", Trigger: "park " + p}},
			Backends: []string{"fake"},
			Expect:   Expect{Ledger: true, Workload: true},
			Labels:   []string{"workload"},
		})
	}
	return out
}
