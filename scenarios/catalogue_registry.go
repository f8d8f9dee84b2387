package scenarios

import (
	"time"

	"github.com/vmchaos/vmchaos/injector"
)

// RegistryOCI (Env.Registry) runs the case against a real OCI registry: the
// distribution server started for the case (scenarios/stack/registry.go),
// the agent with --registry, the checker reading the registry's /v2/ API.
const RegistryOCI = "oci"

// UnitRegistry is Fault.Unit of a registry fault: the case's registry unit.
const UnitRegistry = "registry"

// LabelRegistryOCI labels every case that runs a real registry.
const LabelRegistryOCI = "registry:oci"

// registryEnv is the stack of a registry case: a real registry, the agent's
// registry requests bounded (scaled: 0.5 s at time scale 0.05), a quick
// agent restart.
var registryEnv = Env{Registry: RegistryOCI, RestartDelay: 1 * time.Second,
	AgentFlags: []string{"--registry-timeout", "10s"}}

// The registry's faults land while the agent is parked at a phase of its
// push or pull: agent.push.blobs (every blob uploaded, the manifest not yet
// committed: the push is not done) and agent.pull.manifest (the manifest
// read, no blob downloaded). The park is released right after the fault,
// so the agent meets the dead or frozen registry at once; a restart's is
// released between its stop and its start, which waits for the agent to
// fail its request (runner.registryRestartBetween: released after the whole
// restart, the agent met a registry that answered again or not, as the
// race with its start went).
const (
	pointPushBlobs    = "agent.push.blobs"
	pointPullManifest = "agent.pull.manifest"
)

// registryFaults are the registry fault kinds, each with how long it keeps
// the registry away (sigstop: longer than the agent's request timeout, so
// the request in flight times out instead of waiting out the freeze).
var registryFaults = []Fault{
	{Kind: injector.FaultRegistrySigkill, Unit: UnitRegistry},
	{Kind: injector.FaultRegistrySigstop, Unit: UnitRegistry, StopFor: 20 * time.Second},
	{Kind: injector.FaultRegistryRestart, Unit: UnitRegistry},
}

// coldHibernated is a hibernated VM whose node lost the local copy of its
// snapshot: the wake must pull it from the registry.
var coldHibernated = append(append([]Step{}, hibernated...), Step{Kind: StepDropLocal, VM: vmA})

// registryScenarios are the real-registry cases: a clean hibernate and wake,
// each registry fault mid-push and mid-pull.
func registryScenarios() []Scenario {
	out := []Scenario{{
		ID: "reg-hibernate-wake", SeedRef: "issue 34 registry", Op: OpWake, Speed: "fast",
		Title: "hibernate pushes <name>:hibernate to a real OCI registry and the wake pulls it back: the guest keeps its RAM",
		Setup: hibernated, Act: []Step{{Kind: StepWake, VM: vmA, Wait: true}},
		Faults: []Fault{{Kind: "none"}},
		Env:    registryEnv, Expect: Expect{Ledger: true},
	}, {
		ID: "reg-hibernated-in-registry", SeedRef: "issue 34 registry", Op: OpHibernate, Speed: "slow",
		Title: "a hibernate reported done has its manifest committed under <name>:hibernate on the real registry, every blob served at its digest",
		Setup: readyA, Act: []Step{{Kind: StepHibernate, VM: vmA, Wait: true}},
		Faults:  []Fault{{Kind: "none"}},
		Env:     registryEnv,
		Targets: []string{"push-done-before-commit"},
	}}
	for _, f := range registryFaults {
		push := f
		push.Trigger, push.VM = "park "+pointPushBlobs, vmA
		out = append(out, Scenario{
			ID: "reg-push-" + f.Kind, SeedRef: "issue 34 registry", Op: OpHibernate, Speed: "slow",
			Title: f.Kind + " while the push's blobs are up and its manifest is not committed: the hibernate retries the push once the registry healed, and ends with a whole artifact committed under <name>:hibernate",
			Setup: readyA, Act: []Step{{Kind: StepHibernate, VM: vmA}},
			Faults: []Fault{push},
			Env:    registryEnv, Expect: Expect{FailedOK: true},
		})
		pull := f
		pull.Trigger, pull.VM = "park "+pointPullManifest, vmA
		out = append(out, Scenario{
			ID: "reg-pull-" + f.Kind, SeedRef: "issue 34 registry", Op: OpWake, Speed: "slow",
			Title: f.Kind + " while the wake has read the manifest and downloaded no blob: the wake retries the pull, never fresh-boots, and restores the snapshot",
			Setup: coldHibernated, Act: []Step{{Kind: StepWake, VM: vmA}},
			Faults: []Fault{pull},
			Env:    registryEnv, Expect: Expect{Ledger: true, FailedOK: true},
		})
	}
	out = append(out, registryStorageScenarios()...)
	out = append(out, registryGuardScenarios()...)
	for i := range out {
		out[i].Backends = []string{"fake", "real"}
		out[i].Labels = append(out[i].Labels, LabelRegistryOCI)
	}
	return out
}

func init() { Catalogue = append(Catalogue, registryScenarios()...) }

// storageFull is the registry's storage filled for 20 s (1 s at time scale
// 0.05): longer than the agent's first retries (its backoff starts at
// 2 s, 0.1 s scaled), shorter than all of them, so the hibernate meets
// the full disk more than once and converges after the heal.
var storageFull = Fault{Kind: injector.FaultRegistryStorageFull, Unit: UnitRegistry, StopFor: 20 * time.Second}

// pushFailedThenOK: the push failed at least once (the fault reached it)
// and then succeeded (after the heal).
var pushFailedThenOK = []MetricExpect{
	{Series: `nodeagent_hibernate_total{phase="push",result="failed"}`, Min: 1, Max: -1},
	{Series: `nodeagent_hibernate_total{phase="push",result="ok"}`, Min: 1, Max: -1}}

// registryStorageScenarios are the registry's storage full (ENOSPC on
// every write, the distribution server answering 500) mid-push: at the
// manifest's commit, and from the first blob of the push on. A pull
// writes nothing to the registry, so a full one must still serve it.
func registryStorageScenarios() []Scenario {
	commit, begin, pull := storageFull, storageFull, storageFull
	commit.Trigger, commit.VM = "park "+pointPushBlobs, vmA
	begin.Trigger, begin.VM = "park agent.hibernate.begin", vmA
	pull.Trigger, pull.VM = "park "+pointPullManifest, vmA
	return []Scenario{{
		ID: "reg-push-registry-storage-full", SeedRef: "issue 34 registry", Op: OpHibernate, Speed: "fast",
		Title: "the registry's storage full while the push's blobs are up and its manifest is not committed: the commit fails (500, ENOSPC), the hibernate is not reported done, and once the storage healed the retried push commits a whole artifact under <name>:hibernate",
		Setup: readyA, Act: []Step{{Kind: StepHibernate, VM: vmA}},
		Faults: []Fault{commit},
		Env:    registryEnv, Expect: Expect{FailedOK: true, Metrics: pushFailedThenOK},
		Targets: []string{"push-server-error-done"},
	}, {
		ID: "reg-hibernate-registry-storage-full", SeedRef: "issue 34 registry", Op: OpHibernate, Speed: "slow",
		Title: "the registry's storage full from the hibernate's start: every blob upload of the push fails (500, ENOSPC) until the storage healed, then the retried push commits a whole artifact under <name>:hibernate",
		Setup: readyA, Act: []Step{{Kind: StepHibernate, VM: vmA}},
		Faults: []Fault{begin},
		Env:    registryEnv, Expect: Expect{FailedOK: true, Metrics: pushFailedThenOK},
		Targets: []string{"push-server-error-done"},
	}, {
		ID: "reg-pull-registry-storage-full", SeedRef: "issue 34 registry", Op: OpWake, Speed: "slow",
		Title: "the registry's storage full while the wake has read the manifest: a pull writes nothing to the registry, so the wake restores the snapshot from the full registry; the heal follows",
		Setup: coldHibernated, Act: []Step{{Kind: StepWake, VM: vmA}},
		Faults: []Fault{pull},
		Env:    registryEnv, Expect: Expect{Ledger: true},
	}}
}

// Harness steps of the real-registry cases (runner/registry.go).
const (
	StepDropLocal              = "drop-local-snapshot"       // `vmctl snapshot rm VM`: the node lost its local copy, only the registry has the snapshot
	StepForgetRecord           = "forget-record"             // remove the agent's whole record of VM (agent stopped): a node that never saw it
	StepWakeImage              = "wake-image"                // PUT {snapshot: Image, hibernate: false}: the VM asked to run another image
	StepExpectImageRefused     = "expect-image-refused"      // the agent refuses the restore (image_changed), no VM exists (image-guard)
	StepExpectFreshBootRefused = "expect-fresh-boot-refused" // the agent parks with "(refusing fresh boot)", no VM exists (fail-closed)
)

func init() {
	for _, k := range []string{StepDropLocal, StepForgetRecord, StepWakeImage, StepExpectImageRefused, StepExpectFreshBootRefused} {
		StepKinds[k] = true
	}
}

// imageV2 is the image the VM is asked to run after it was hibernated.
const imageV2 = "base-v2"

// registryGuardScenarios are the two fail-closed paths of seed 001 against
// the real registry: the image changed while a :hibernate snapshot exists,
// and the hibernate evidence unreadable (registry unreachable) until the
// agent's retry budget is spent.
func registryGuardScenarios() []Scenario {
	// the agent stopped, and its node forgets the VM: only the registry
	// still holds vm-a:hibernate
	newNode := []Step{{Kind: StepForgetRecord, VM: vmA}, {Kind: StepDropLocal, VM: vmA}}
	lostStatus := []Step{{Kind: StepWipeStatus, VM: vmA}, {Kind: StepDropLocal, VM: vmA}}
	return []Scenario{{
		ID: "reg-image-changed", SeedRef: "001 image guard", Op: OpWake, Speed: "slow",
		Title:        "the VM asked to run another image while its :hibernate snapshot exists (a node that never saw it): the agent refuses the restore with reason image_changed and boots nothing; put back on its image, the wake restores the snapshot",
		Setup:        hibernated,
		Faults:       []Fault{{Kind: "stop", Trigger: "now", StopFor: 500 * time.Millisecond}},
		WhileStopped: newNode,
		After: []Step{{Kind: StepWakeImage, VM: vmA, Image: imageV2}, {Kind: StepExpectImageRefused, VM: vmA},
			{Kind: StepWake, VM: vmA, Wait: true}},
		Env: registryEnv,
		// the refusal is visible outside the node: a failed write counted by its reason
		Expect: Expect{Ledger: true, FailedOK: true, Metrics: []MetricExpect{
			{Series: `nodeagent_lifecycle_failed_total{reason="image_changed"}`, Min: 1, Max: -1}}},
		Targets: []string{"image-guard-off"},
	}, {
		ID: "reg-evidence-registry-unreachable", SeedRef: "001 held up", Op: OpWake, Speed: "slow",
		Title: "classify budget exhaustion with the registry unreachable: the agent lost its status, the registry frozen; every evidence lookup fails, the retries are spent and the agent parks with (refusing fresh boot), no VM; once the registry healed, a new generation restores the snapshot",
		Setup: hibernated,
		Faults: []Fault{{Kind: "stop", Trigger: "now", StopFor: 500 * time.Millisecond},
			{Kind: injector.FaultRegistrySigstop, Unit: UnitRegistry, Trigger: TriggerWhileDown, StopFor: 200 * time.Second}},
		WhileStopped: lostStatus,
		After: []Step{{Kind: StepWake, VM: vmA}, {Kind: StepExpectFreshBootRefused, VM: vmA},
			{Kind: StepWake, VM: vmA, Wait: true}},
		Env: Env{Registry: RegistryOCI, RestartDelay: 1 * time.Second,
			AgentFlags: []string{"--registry-timeout", "10s", "--retry-attempts", "1"}},
		// every failed lookup is counted, and the one after the heal found
		// the snapshot in the registry
		Expect: Expect{Ledger: true, FailedOK: true, Metrics: []MetricExpect{
			{Series: `nodeagent_hibernate_evidence_total{verdict="error"}`, Min: 2, Max: -1},
			{Series: `nodeagent_lifecycle_failed_total{reason="evidence"}`, Min: 2, Max: -1},
			{Series: `nodeagent_hibernate_evidence_total{verdict="registry"}`, Min: 1, Max: -1}}},
		Targets: []string{"evidence-error-boots-fresh"},
	}}
}
