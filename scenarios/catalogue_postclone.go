package scenarios

import "time"

// Seed paths of issue 34 (items 5 and 6) on one node: the post-clone states
// of seed 001's "what held up" besides `running`, and its observability
// gaps (a wedge visible outside the node, honest counters).

// Steps that hand-edit the agent's durable record while it is stopped, the
// way the field hand-edited a pod's annotations (seed 001: "a hand-injected
// stale done"), and the operator's retry of a parked intent.
const (
	// StepMarkPostCloneFailed writes the record the agent itself writes
	// after a failed post-clone check: op create at step cloned,
	// lifecycle failed, post_clone failed, failed_reason post_clone,
	// attempt 1 of the current generation (the VM stays bound).
	StepMarkPostCloneFailed = "mark-post-clone-failed"
	// StepWipeLifecycle removes the lifecycle marker and keeps the
	// post_clone marker (which must be there).
	StepWipeLifecycle = "wipe-lifecycle"
	// StepMarkPostCloneDone injects a stale post_clone=done into a record
	// with no VM bound (a marker of an incarnation that is gone).
	StepMarkPostCloneDone = "mark-post-clone-done"
	// StepOperatorRetry leaves the (parked) intent alone for longer than
	// its operation's budget plus the checker's slack, as published by
	// the agent (GET /v1/events), then PUTs it again: a new generation.
	StepOperatorRetry = "operator-retry"
)

func init() {
	for _, k := range []string{StepMarkPostCloneFailed, StepWipeLifecycle, StepMarkPostCloneDone, StepOperatorRetry} {
		StepKinds[k] = true
	}
	ss := withReal(seedPathScenarios)
	for i := range ss {
		ss[i].Labels = append(ss[i].Labels, LabelSeedPaths)
	}
	Catalogue = append(Catalogue, ss...)
}

// LabelSeedPaths selects this file's cases (`--label-filter seedpaths`).
const LabelSeedPaths = "seedpaths"

var seedPathScenarios = []Scenario{
	// ---- seed 001 held: post-clone states --------------------------------
	{
		// The only window between post_clone done and ready is a wake's
		// removal of its hibernate snapshot: the agent dies with that
		// `snapshot rm` parked.
		ID: "s001-h-post-clone-done", SeedRef: "001 held", Op: OpWake, Speed: "fast",
		Title:  "post_clone=done (ready not written) at the restart is dispatched as ready_wait: the wake dies while removing its hibernate snapshot",
		Setup:  hibernated,
		Act:    []Step{{Kind: StepWake, VM: vmA}},
		Faults: []Fault{{Kind: "sigkill-main", Trigger: "park snapshot.rm.tombstoned"}},
		Env:    Env{RestartDelay: 1 * time.Second},
		Expect: Expect{Ledger: true, Metrics: []MetricExpect{
			{Series: `nodeagent_startup_resume_total{op="ready_wait"}`, Min: 1, Max: -1},
		}},
		Targets: []string{"post-clone-done-ignored"},
	},
	{
		ID: "s001-h-post-clone-failed", SeedRef: "001 held", Op: OpCreate, Speed: "fast",
		Title: "post_clone=failed (lifecycle failed) at the restart is parked for startup, zero dispatch; the failed path alone retries it to ready, on the same VM",
		Setup: readyA,
		// the record the agent writes after a failed post-clone check,
		// written by hand while it is stopped
		Faults:       []Fault{{Kind: "stop", Trigger: "now", StopFor: 500 * time.Millisecond}},
		WhileStopped: []Step{{Kind: StepMarkPostCloneFailed, VM: vmA}},
		Expect: Expect{Adopted: true, Metrics: []MetricExpect{
			{Series: `nodeagent_startup_resume_total{op="post_clone"}`, Min: 0, Max: 0},
			{Series: `nodeagent_startup_resume_total{op="ready_wait"}`, Min: 0, Max: 0},
			{Series: `nodeagent_startup_resume_total{op="create"}`, Min: 0, Max: 0},
		}},
		Targets: []string{"post-clone-failed-dispatched"},
	},
	{
		ID: "s001-h-empty-lifecycle-marker", SeedRef: "001 held", Op: OpCreate, Speed: "fast",
		Title:        "an empty lifecycle with a post_clone marker present is still dispatched (as post_clone work) and reaches ready on the same VM",
		Act:          []Step{{Kind: StepCreate, VM: vmA}},
		Faults:       []Fault{{Kind: "stop", Trigger: "park agent.create.cloned", VM: vmA, StopFor: 1 * time.Second}},
		WhileStopped: []Step{{Kind: StepWipeLifecycle, VM: vmA}},
		Expect: Expect{Adopted: true, Metrics: []MetricExpect{
			{Series: `nodeagent_startup_resume_total{op="post_clone"}`, Min: 1, Max: -1},
		}},
		Targets: []string{"empty-lifecycle-not-dispatched"},
	},
	{
		ID: "s001-h-post-clone-marker-incarnation", SeedRef: "001 held", Op: OpHibernate, Speed: "fast",
		Title:        "the post_clone marker dies with its VM incarnation: none after the hibernate, and a stale done hand-injected into the hibernated intent is gone after the restart",
		Setup:        hibernated,
		Faults:       []Fault{{Kind: "stop", Trigger: "now", StopFor: 500 * time.Millisecond}},
		WhileStopped: []Step{{Kind: StepMarkPostCloneDone, VM: vmA}},
		Targets:      []string{"post-clone-marker-outlives-incarnation"},
	},

	// ---- seed 001 observability ------------------------------------------
	{
		// Every retry of the wake fails at its first step until the third;
		// the wake then succeeds. One wake, one outcome: ok.
		ID: "s001-obs-wake-retry-storm", SeedRef: "001 obs", Op: OpWake, Speed: "fast",
		Title:  "a wake that fails three retries before it succeeds counts one outcome (wake_total ok 1, failed 0); the retries count in lifecycle_failed_total",
		Setup:  hibernated,
		Act:    []Step{{Kind: StepWake, VM: vmA}},
		Faults: []Fault{{Kind: "failpoint", Trigger: "at agent.failed", Window: [2]string{"agent.wake.begin", "agent.wake.ready"}}},
		Env:    Env{Failpoints: "agent.wake.begin=3*error(transient registry blip)@vm=" + vmA},
		Expect: Expect{FailedOK: true, Ledger: true, Metrics: []MetricExpect{
			{Series: `nodeagent_wake_total{result="failed"}`, Min: 0, Max: 0},
			{Series: `nodeagent_wake_total{result="ok"}`, Min: 1, Max: 1},
			{Series: `nodeagent_lifecycle_failed_total{reason="wake_begin"}`, Min: 3, Max: 3},
		}},
		Targets: []string{"wake-failed-per-retry"},
	},
	{
		// The create fails once after its clone with no automatic retry
		// left: it is parked until the operator's new generation, longer
		// than its budget (budgets shrunk to 3 s at scale 1).
		ID: "s001-obs-wedge-visible", SeedRef: "001 obs", Op: OpCreate, Speed: "fast",
		Title:  "an intent parked past its operation's budget is visible outside the node: a wedge event on GET /v1/events naming the VM and the reason, and nodeagent_wedged_total",
		Act:    []Step{{Kind: StepCreate, VM: vmA}},
		Faults: []Fault{{Kind: "failpoint", Trigger: "at agent.failed", Window: [2]string{"agent.create.begin", "agent.create.ready"}}},
		After:  []Step{{Kind: StepOperatorRetry, VM: vmA}},
		Env: Env{Failpoints: "agent.create.cloned=1*error(post-clone setup blip)@vm=" + vmA,
			AgentFlags: []string{"--retry-attempts=0", "--ready-budget=40s", "--retry-max=20s"}},
		Expect: Expect{Metrics: []MetricExpect{
			{Series: `nodeagent_wedged_total{op="create",reason="clone"}`, Min: 1, Max: 1},
		}},
		Targets: []string{"wedge-log-only"},
	},
	{
		ID: "s001-obs-evidence-resumed", SeedRef: "001 obs", Op: OpCreate, Speed: "fast",
		Title:   "the hibernate-evidence lookup of a create resumed at startup is counted on nodeagent_hibernate_evidence_total",
		Act:     []Step{{Kind: StepCreate, VM: vmA}},
		Faults:  []Fault{{Kind: "sigkill-main", Trigger: "park agent.create.begin", VM: vmA}},
		Env:     Env{RestartDelay: 1 * time.Second},
		Expect:  Expect{Metrics: []MetricExpect{{Series: `nodeagent_startup_resume_total{op="create"}`, Min: 1, Max: -1}}},
		Targets: []string{"evidence-lookup-uncounted"},
	},
}
