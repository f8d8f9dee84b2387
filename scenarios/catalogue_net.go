package scenarios

import (
	"time"

	"github.com/vmchaos/vmchaos/injector"
)

// LabelNet labels every case whose node and registry sit in network
// namespaces of the case, linked by a veth pair (the net-* faults).
const LabelNet = "net:veth"

// netFor is how long a fault keeps the node's path cut or impaired: 20 s
// (1 s at time scale 0.05), twice the agent's registry request deadline
// (--registry-timeout 10s, 0.5 s scaled) and longer than its first retries,
// shorter than all of them: the operation meets the fault more than once
// and converges after the heal.
const netFor = 20 * time.Second

// netFault is a fault of kind on the node's path, parked at point.
func netFault(kind, point string) Fault {
	return Fault{Kind: kind, Unit: UnitRegistry, StopFor: netFor, Trigger: "park " + point, VM: vmA}
}

// cycleCold is a hibernate and a wake that must pull the snapshot back from
// the registry (the node dropped its local copy in between).
var cycleCold = []Step{{Kind: StepHibernate, VM: vmA, Wait: true}, {Kind: StepDropLocal, VM: vmA},
	{Kind: StepWake, VM: vmA, Wait: true}}

// netScenarios are the network faults between the node and the real
// registry (issue 34 item 3): a partition mid-push and mid-pull, delay and
// loss through a hibernate → wake. Every fault heals before the final
// check, which reads the registry from its own namespace.
func netScenarios() []Scenario {
	out := []Scenario{{
		ID: "net-push-partition", SeedRef: "issue 34 network", Op: OpHibernate, Speed: "fast",
		Title: "the node cut off from the registry while the push's blobs are up and its manifest is not committed: the commit never reaches the registry, the hibernate is not reported done, and once the path healed the retried push commits a whole artifact under <name>:hibernate",
		Setup: readyA, Act: []Step{{Kind: StepHibernate, VM: vmA}},
		Faults: []Fault{netFault(injector.FaultNetPartition, pointPushBlobs)},
		Env:    registryEnv, Expect: Expect{FailedOK: true, Metrics: pushFailedThenOK},
		// push-done-before-commit fails it too (repro), but its selftest
		// row stays reg-hibernated-in-registry's
		Targets: []string{"push-timeout-done"},
	}, {
		ID: "net-pull-partition", SeedRef: "issue 34 network", Op: OpWake, Speed: "slow",
		Title: "the node cut off from the registry while the wake has read the manifest and downloaded no blob: the pull fails, the wake retries it, never fresh-boots, and restores the snapshot once the path healed",
		Setup: coldHibernated, Act: []Step{{Kind: StepWake, VM: vmA}},
		Faults: []Fault{netFault(injector.FaultNetPartition, pointPullManifest)},
		Env:    registryEnv, Expect: Expect{Ledger: true, FailedOK: true},
	}, {
		// nightly, not slow: netem is missing from some kernels (this
		// project's VM's among them), where the case is not run and would
		// turn `make chaos`'s gate inconclusive; the nightly KVM runners
		// have it
		ID: "net-cycle-delay", SeedRef: "issue 34 network", Op: OpWake, Speed: "nightly",
		Title: "every packet between the node and the registry delayed from the push's manifest commit on: the hibernate commits a whole artifact (its requests retried past their deadlines while the delay lasts), and the wake pulls it back with the guest's RAM, under the delay or after its heal",
		Setup: readyA, Act: cycleCold,
		Faults: []Fault{netFault(injector.FaultNetDelay, pointPushBlobs)},
		Env:    registryEnv, Expect: Expect{Ledger: true, FailedOK: true},
	}, {
		ID: "net-cycle-loss", SeedRef: "issue 34 network", Op: OpWake, Speed: "slow",
		Title: "a share of the packets between the node and the registry lost from the push's manifest commit on: the hibernate commits a whole artifact, and the wake pulls it back with the guest's RAM, under the loss or after its heal",
		Setup: readyA, Act: cycleCold,
		Faults: []Fault{netFault(injector.FaultNetLoss, pointPushBlobs)},
		Env:    registryEnv, Expect: Expect{Ledger: true, FailedOK: true},
	}}
	for i := range out {
		out[i].Backends = []string{"fake"}
		out[i].Labels = append(out[i].Labels, LabelRegistryOCI, LabelNet)
	}
	return out
}

func init() { Catalogue = append(Catalogue, netScenarios()...) }
