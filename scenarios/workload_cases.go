package scenarios

import (
	"slices"
	"strings"
	"time"
)

// wlSavePoints are the phases of a snapshot save the workload cases hold or
// kill the save at: the ops lock taken, the VMM paused, the capture written,
// the VMM resumed.
var wlSavePoints = []string{"snapshot.save.locked", "snapshot.save.paused", "snapshot.save.captured", "snapshot.save.resumed"}

// workloadScenarios are the cases of issue #13 and issue 31 item 4 that exist
// for the guest workload.
//
//   - wl-save-held-<phase>: a direct save of a VM whose writer runs, held
//     parked at each phase of the save (the park is the interference: the
//     capture, the pause or the ops lock held for as long as the harness
//     holds it). The runner clones each save's snapshot and judges the
//     clone's markers as a consistent cut of the save's pause/resume window,
//     so every case is also a clone of a snapshot taken under workload.
//   - wl-save-killed-<phase>-<kind>: the agent's save (its hibernate's
//     snapshot save) under workload, parked at each phase and killed there —
//     SIGKILL of the agent, SIGKILL of the save child, a power cut of the
//     node. No cut of the killed save exists; the agent's recovery saves
//     again and the case wakes the VM: the woken guest's markers are judged
//     as the cut of that next successful save (every marker acked before the
//     hibernate's NIC drop present, no holes, the boot id kept unless the
//     power cut took the VMM).
func workloadScenarios() []Scenario {
	var out []Scenario
	for _, p := range wlSavePoints {
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
	return append(out, killedSaveScenarios()...)
}

// wlKilledFast are the killed-save cases in speed:fast: the save child
// killed while the VMM is paused (the agent's retry finds a Paused VMM), and
// the agent killed after the capture (its restart resumes the hibernate
// over a capture no save finished). The power cuts stay slow: the fast
// subset holds few of them (TestPowerCutCasesCoverEveryPhaseByRule).
var wlKilledFast = map[string]bool{"paused/sigkill-child": true, "captured/sigkill-main": true}

// killedSaveScenarios is wl-save-killed-<phase>-<kind>: every save phase of
// wlSavePoints × {sigkill-main, sigkill-child, power-cut}.
func killedSaveScenarios() []Scenario {
	var out []Scenario
	for _, p := range wlSavePoints {
		phase := strings.TrimPrefix(p, "snapshot.save.")
		for _, kind := range []string{"sigkill-main", "sigkill-child", FaultPowerCut} {
			f := Fault{Kind: kind, Trigger: "park " + p}
			env := Env{RestartDelay: 1 * time.Second}
			what := map[string]string{"sigkill-main": "SIGKILL of the agent", "sigkill-child": "SIGKILL of the save child",
				FaultPowerCut: "a power cut of the node"}[kind]
			switch kind {
			case "sigkill-child":
				f.Child = "snapshot-save"
			case FaultPowerCut:
				env.RestartDelay = 5 * time.Second // as packaged, like the other power cuts
			}
			s := Scenario{
				ID: "wl-save-killed-" + phase + "-" + kind, SeedRef: "gap", Op: OpSave, Speed: "slow",
				Title: "the agent's save under the guest workload killed at " + p + " by " + what +
					": the recovery saves again and the woken guest holds the cut of that save (every marker acked before the NIC drop, no holes)",
				Setup:  readyA,
				Act:    []Step{{Kind: StepHibernate, VM: vmA}},
				Faults: []Fault{f},
				// the hibernate carried through first (the recovery's
				// save), then the wake: a wake put while the agent still
				// retries would cancel the hibernate instead
				After:    []Step{{Kind: StepHibernate, VM: vmA, Wait: true}, {Kind: StepWake, VM: vmA, Wait: true}},
				Backends: []string{"fake"},
				Env:      env,
				Expect:   Expect{Ledger: true, Workload: true},
				Labels:   []string{"workload", "trigger:park"},
			}
			if wlKilledFast[phase+"/"+kind] {
				s.Speed = "fast"
			}
			out = append(out, s)
			if kind == "sigkill-child" && phase != "locked" {
				// the embedder's other answer to a stuck hibernate: wake at
				// once, which cancels it; the dead save's capture must not
				// outlive it in the running VM's dir
				w := s
				w.ID, w.Speed = s.ID+"-then-wake", "slow"
				w.Title = "the agent's save under the guest workload killed at " + p + " by " + what +
					", then a wake that cancels the hibernate: no capture of the dead save is left in the running VM's dir, the guest keeps its markers"
				w.After = []Step{{Kind: StepWake, VM: vmA, Wait: true}}
				w.Targets = []string{"killed-save-not-collected"}
				// the agent's retry of the hibernate waits (3 s at scale
				// 0.05), so the wake always comes first: a retried save
				// would reclaim the dead capture itself and hide the bug
				// (17/20 at the default 100 ms under load)
				w.Env.AgentFlags = append(slices.Clone(s.Env.AgentFlags), "--retry-base", "60s", "--retry-max", "120s")
				out = append(out, w)
			}
		}
	}
	return out
}

// HasWriter says whether the case's stack has a guest running the workload
// writer: the runner starts it in every guest that gets a ledger marker.
func (s *Scenario) HasWriter() bool {
	for _, st := range s.steps() {
		if st.Kind == StepLedgerWrite {
			return true
		}
	}
	return false
}

// JudgesCut says whether workload-consistent-cut is compulsory in the case
// (issue 31 item 4): a guest runs the writer and the case takes or restores
// a snapshot after it started — its operation is a save, hibernate, wake or
// clone (SnapshotOps), or a step after the writer's start takes one
// (snapshotSteps). Decided from the case
// itself, never from a flag.
func (s *Scenario) JudgesCut() bool {
	if s.Mgr != nil || !s.HasWriter() {
		return false
	}
	if OpNeedsSnapshot(s.Op) {
		return true
	}
	writing := false
	for _, st := range s.steps() {
		writing = writing || st.Kind == StepLedgerWrite
		if writing && snapshotSteps[st.Kind] {
			return true
		}
	}
	return false
}

// steps are every step of the case in the order the runner runs them.
func (s *Scenario) steps() []Step {
	out := append(append([]Step{}, s.Setup...), s.Act...)
	return append(append(out, s.WhileStopped...), s.After...)
}
