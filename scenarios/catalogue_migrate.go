package scenarios

import (
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/injector"
)

// OpMigrate is the cross-node migration (label op:migrate): the control
// plane moves a VM's placement from node A to node B; A hibernates it to
// the real registry (<name>:hibernate committed) and releases it, then B
// wakes it from the registry, cold (docs/controlplane.md).
const OpMigrate = "migrate"

// Cluster node names of the migration cases: the case's first node stack
// (with the registry) and its second.
const (
	NodeA = "node-a"
	NodeB = "node-b"
	NodeC = "node-c" // the third node of a three-node case
)

// UnitNodeB is Fault.Unit of a fault on the second node's agent.
const UnitNodeB = NodeB

// UnitControlPlane is Fault.Unit of a fault on the control plane's own
// process (cmd/controlplane, a unit of the run's supervisor).
const UnitControlPlane = "controlplane"

// Harness steps of the cluster cases (runner/cluster.go).
const (
	StepPlace   = "place"   // put VM {snapshot: base, node: Node} on the control plane; with Wait: until Node's agent has it ready
	StepMigrate = "migrate" // move VM's placement to Node; with Wait: until Node's agent has it ready and no other node holds it
	// StepExpectParked waits until the case's own node reports VM failed
	// with its automatic retries exhausted: a leftover failed (with
	// Step.Refused: the product's refusal the case expects, named in the
	// failure's message).
	StepExpectParked = "expect-parked"
	// StepExpectImageRefusedOn waits until Node's agent refuses to restore
	// VM into another image (image_changed) and holds no VM of it
	StepExpectImageRefusedOn = "expect-image-refused-on"
	// StepAwaitMigrated waits until VM is live on Node alone and verifies
	// its guest's ledger there (a migrate step without Wait, then faults)
	StepAwaitMigrated = "await-migrated"
)

func init() {
	for _, k := range []string{StepPlace, StepMigrate, StepExpectParked, StepAwaitMigrated, StepExpectImageRefusedOn} {
		StepKinds[k] = true
	}
	// a migration hibernates the VM on its source and wakes it on its
	// target: the workload's cut of that hibernate is judged on the target
	snapshotSteps[StepMigrate] = true
	Catalogue = append(Catalogue, migrateScenarios()...)
}

// migrateEnv is two node stacks, the control plane, the real registry.
var migrateEnv = Env{Registry: RegistryOCI, Nodes: 2, RestartDelay: 1 * time.Second,
	AgentFlags: []string{"--registry-timeout", "10s"}}

// placedA is vm-a running on node A with ledger markers in its guest.
var placedA = []Step{{Kind: StepPlace, VM: vmA, Node: NodeA, Wait: true}, ledgerA}

// migrateScenarios are the cross-node migration cases.
func migrateScenarios() []Scenario {
	out := []Scenario{{
		ID: "mig-a-to-b", SeedRef: "issue 34 migrate", Op: OpMigrate, Speed: "fast",
		Title: "the control plane moves vm-a from node A to node B: A hibernates it to the real registry and releases it, B wakes it from the registry; one live VM of the name throughout, the guest keeps its RAM",
		Setup: placedA, Act: []Step{{Kind: StepMigrate, VM: vmA, Node: NodeB, Wait: true}},
		Faults:  []Fault{{Kind: "none"}},
		Env:     migrateEnv,
		Targets: []string{"migrate-release-before-push", "migrate-target-skips-release", "migrate-target-skips-evidence"},
	}, {
		ID: "mig-leftover-failed", SeedRef: "001 #5", Op: OpMigrate, Speed: "slow",
		Title: "a leftover failed must not block a later migration: vm-a's hibernate on node A parked failed (an AR push blip, no retry left); the control plane then moves it to node B, and the move's own hibernate must run again, push, release, and B wake it",
		Setup: placedA,
		Act: []Step{{Kind: StepHibernate, VM: vmA}, {Kind: StepExpectParked, VM: vmA},
			{Kind: StepMigrate, VM: vmA, Node: NodeB, Wait: true}},
		Faults: []Fault{{Kind: "failpoint", Trigger: "at agent.failed", Window: [2]string{"agent.hibernate.begin", "agent.migrate.released"}}},
		Env: Env{Registry: RegistryOCI, Nodes: 2, RestartDelay: 1 * time.Second,
			Failpoints: "agent.push.blobs=1*error(AR push blip)@vm=" + vmA,
			AgentFlags: []string{"--registry-timeout", "10s", "--retry-attempts=0"}},
		Expect:  Expect{FailedOK: true},
		Targets: []string{"migrate-failed-noop"},
	}}
	out = append(out, Scenario{
		ID: "mig-image-changed", SeedRef: "001 image guard", Op: OpMigrate, Speed: "slow",
		Title: "the control plane moves vm-a to node B and asks for another image at the same time: B must refuse to restore A's :hibernate snapshot into it (image_changed, no VM); put back on its image, B wakes vm-a with its RAM",
		Setup: placedA,
		Act: []Step{{Kind: StepMigrate, VM: vmA, Node: NodeB, Image: imageV2}, {Kind: StepExpectImageRefusedOn, VM: vmA, Node: NodeB},
			{Kind: StepMigrate, VM: vmA, Node: NodeB, Wait: true}},
		Faults: []Fault{{Kind: "none"}},
		// the refusal's failed is node B's: node A (the stack the final
		// checker reads) writes none
		Env:     migrateEnv,
		Targets: []string{"image-guard-off"},
	})
	out = append(out, migrateMatrix()...)
	out = append(out, migrateTargetScenarios()...)
	out = append(out, migrateWakeScenarios()...)
	out = append(out, migrateThreeNodeScenarios()...)
	out = append(out, migrateControlPlaneScenarios()...)
	out = append(out, migrateNetScenarios()...)
	for i := range out {
		out[i].Backends = []string{"fake"}
		out[i].Labels = append(out[i].Labels, LabelRegistryOCI)
	}
	return out
}

// migratePoints are the phases of a migration on its source, in order:
// the move applied as a hibernate, the snapshot saved, its blobs up (the
// manifest not committed), the manifest committed, the VM removed, the
// release told to the control plane (the record not yet deleted).
var migratePoints = []string{"agent.migrate.applied", "agent.hibernate.saved", pointPushBlobs,
	"agent.hibernate.pushed", "agent.hibernate.removed", "agent.migrate.released"}

// migrateMatrix is the migration's phases on its source × the faults:
// the source's agent SIGKILLed (and restarted by its supervisor) at each
// phase, systemctl restart at the release, and the registry killed or
// restarted while the push's manifest is not committed. The placement
// moves, the fault lands on the parked source, and the migration must
// still end with the VM live on the target alone, its guest's RAM kept.
func migrateMatrix() []Scenario {
	type cell struct {
		point string
		fault Fault
	}
	var cells []cell
	for _, p := range migratePoints {
		cells = append(cells, cell{p, Fault{Kind: "sigkill-main"}})
	}
	cells = append(cells, cell{"agent.migrate.released", Fault{Kind: "restart"}},
		cell{pointPushBlobs, Fault{Kind: injector.FaultRegistrySigkill, Unit: UnitRegistry}},
		cell{pointPushBlobs, Fault{Kind: injector.FaultRegistryRestart, Unit: UnitRegistry}})
	var out []Scenario
	for _, c := range cells {
		f := c.fault
		f.Trigger, f.VM = "park "+c.point, vmA
		short := strings.ReplaceAll(strings.TrimPrefix(c.point, "agent."), ".", "-")
		out = append(out, Scenario{
			ID: "mig-" + f.Kind + "-at-" + short, SeedRef: "issue 34 migrate", Op: OpMigrate, Speed: "slow",
			Title: f.Kind + " on the migration's source at " + c.point + ": the migration resumes by itself and ends with vm-a live on node B alone, woken from the registry with its RAM",
			Setup: placedA, Act: []Step{{Kind: StepMigrate, VM: vmA, Node: NodeB}},
			Faults: []Fault{f},
			After:  []Step{{Kind: StepAwaitMigrated, VM: vmA, Node: NodeB}},
			Env:    migrateEnv,
			// a registry fault fails the push at least once
			Expect: Expect{FailedOK: f.Unit == UnitRegistry},
		})
	}
	return out
}

// migrateTargetScenarios: the target's agent SIGKILLed (its supervisor
// restarts it) while the source, parked at a phase of the hibernate it
// runs for the migration, has not released the VM yet. The restarted
// target must take the placement up again, still wait for the release,
// and wake the VM.
func migrateTargetScenarios() []Scenario {
	var out []Scenario
	for _, p := range []string{"agent.hibernate.saved", "agent.hibernate.pushed"} {
		out = append(out, Scenario{
			ID: "mig-target-sigkill-main-at-source-" + strings.ReplaceAll(strings.TrimPrefix(p, "agent."), ".", "-"), SeedRef: "issue 34 migrate", Op: OpMigrate, Speed: "slow",
			Title:  "node B's agent SIGKILLed while node A, hibernating vm-a for it, is at " + p + " (not released): the restarted target takes the placement up again, waits for the release, and wakes vm-a from the registry with its RAM; one live VM throughout",
			Setup:  placedA,
			Act:    []Step{{Kind: StepMigrate, VM: vmA, Node: NodeB}},
			Faults: []Fault{{Kind: "sigkill-main", Unit: UnitNodeB, Trigger: "park " + p, VM: vmA}},
			After:  []Step{{Kind: StepAwaitMigrated, VM: vmA, Node: NodeB}},
			Env:    migrateEnv,
		})
	}
	return out
}

// migrateWakePoints are the phases of a migration's wake on its target, in
// order, with their short names: the create's hibernate-evidence lookup
// (it found <name>:hibernate: the create becomes a wake), the pull (the
// manifest read, no blob downloaded), the snapshot local (pulled), the VM
// restored from it (cloned, not yet checked running), the VM ready.
var migrateWakePoints = []struct{ point, short string }{
	{"agent.evidence.lookup", "evidence"}, {pointPullManifest, "pull"}, {"agent.wake.pulled", "pulled"},
	{"agent.wake.cloned", "restore"}, {"agent.wake.ready", "ready"},
}

// migrateWakeScenarios: faults at the target's own phases. Node B's agent
// is armed to park at each phase of its wake (Fault.Node), and there it is
// SIGKILLed (its supervisor restarts it), stopped for a while (the
// operator starts it again) or restarted; the registry is SIGKILLed,
// SIGSTOPped or restarted while B's pull has read the manifest and no
// blob. The restarted target must resume the wake (never boot fresh over
// the :hibernate snapshot its source pushed) and end with vm-a live on B
// alone, its guest's RAM kept. The SIGKILLs and the registry's kill and
// freeze run in make chaos, the rest nightly.
func migrateWakeScenarios() []Scenario {
	var out []Scenario
	add := func(f Fault, short, speed string) {
		f.Node, f.VM = NodeB, vmA
		who := "node B's agent"
		if f.Unit == UnitRegistry {
			who = "the registry"
		}
		out = append(out, Scenario{
			ID: "mig-wake-" + f.Kind + "-at-" + short, SeedRef: "issue 34 migrate", Op: OpMigrate, Speed: speed,
			Title: f.Kind + " of " + who + " while node B, waking vm-a for the migration, is parked at " + strings.TrimPrefix(f.Trigger, "park ") +
				": the target resumes the wake from the registry, never boots fresh, and ends with vm-a live on node B alone with its RAM",
			Setup:  placedA,
			Act:    []Step{{Kind: StepMigrate, VM: vmA, Node: NodeB}},
			Faults: []Fault{f},
			After:  []Step{{Kind: StepAwaitMigrated, VM: vmA, Node: NodeB}},
			Env:    migrateEnv,
			// a registry fault mid-pull fails the wake at least once
			Expect: Expect{FailedOK: f.Unit == UnitRegistry},
		})
		if f.Kind == "sigkill-main" && (short == "pull" || short == "pulled") {
			// killed after the create became a wake, before the restore
			i := len(out) - 1
			out[i].Targets = []string{"migrate-wake-resumed-as-create"}
		}
	}
	for _, p := range migrateWakePoints {
		trig := "park " + p.point
		add(Fault{Kind: "sigkill-main", Unit: UnitNodeB, Trigger: trig}, p.short, "slow")
		add(Fault{Kind: "stop", Unit: UnitNodeB, Trigger: trig, StopFor: 10 * time.Second}, p.short, "nightly")
		add(Fault{Kind: "restart", Unit: UnitNodeB, Trigger: trig}, p.short, "nightly")
	}
	for _, f := range registryFaults {
		speed := "slow"
		if f.Kind == injector.FaultRegistryRestart {
			speed = "nightly"
		}
		f.Trigger = "park " + pointPullManifest
		add(f, "pull", speed)
	}
	return out
}

// migrateThreeNodeScenarios run a cluster of three nodes: one VM moved
// twice (A → B → C: the first move's target is the second's source, waking
// and then hibernating the VM it got from the registry), and two VMs moved
// at once from A to two different nodes. cluster-one-live-vm samples every
// moved VM on every node throughout.
func migrateThreeNodeScenarios() []Scenario {
	env := migrateEnv
	env.Nodes = 3
	return []Scenario{{
		ID: "mig-a-to-b-to-c", SeedRef: "issue 34 migrate", Op: OpMigrate, Speed: "slow",
		Title: "three nodes: the control plane moves vm-a from node A to node B, then from B to node C; B wakes it from A's :hibernate, then hibernates it and releases it to C, which wakes it; one live VM of the name throughout, the guest keeps its RAM across both moves",
		Setup: placedA,
		Act: []Step{{Kind: StepMigrate, VM: vmA, Node: NodeB, Wait: true},
			{Kind: StepMigrate, VM: vmA, Node: NodeC, Wait: true}},
		Faults:  []Fault{{Kind: "none"}},
		Env:     env,
		Targets: []string{"migrate-target-skips-release"},
	}, {
		ID: "mig-two-vms-three-nodes", SeedRef: "issue 34 migrate", Op: OpMigrate, Speed: "slow",
		Title: "three nodes: vm-a and vm-b both run on node A; the control plane moves vm-a to node B and vm-b to node C at once; A hibernates both, each target wakes its own from the registry; one live VM per name throughout, both guests keep their RAM",
		Setup: append(append([]Step{}, placedA...), Step{Kind: StepPlace, VM: vmB, Node: NodeA, Wait: true},
			Step{Kind: StepLedgerWrite, VM: vmB}),
		Act:    []Step{{Kind: StepMigrate, VM: vmA, Node: NodeB}, {Kind: StepMigrate, VM: vmB, Node: NodeC}},
		Faults: []Fault{{Kind: "none"}},
		After: []Step{{Kind: StepAwaitMigrated, VM: vmA, Node: NodeB},
			{Kind: StepAwaitMigrated, VM: vmB, Node: NodeC}},
		Env:     env,
		Targets: []string{"migrate-target-skips-release"},
	}}
}

// migrateControlPlaneScenarios: the control plane's own process
// (cmd/controlplane, its state in a file written before every answer) is
// SIGKILLed (its supervisor restarts it), restarted or frozen for 20 s
// (scaled) mid-migration: while the source, hibernating for the move, has
// not released yet (parked at agent.hibernate.pushed: its release meets
// the dead control plane), right after the source's release was answered
// (agent.migrate.released: the release must have been durable before the
// answer), and while the target is mid-wake (node B parked at
// agent.wake.pulled). The agents keep what they run while it is away and
// resume the migration once it answers again; it must come back with
// every answer it gave. The SIGKILLs run in make chaos, the rest nightly.
func migrateControlPlaneScenarios() []Scenario {
	type at struct{ node, point, short string }
	points := []at{{"", "agent.hibernate.pushed", "source-pushed"}, {"", "agent.migrate.released", "source-released"},
		{NodeB, "agent.wake.pulled", "target-pulled"}}
	faults := []Fault{{Kind: "sigkill-main"}, {Kind: "restart"}, {Kind: "sigstop", StopFor: 20 * time.Second}}
	var out []Scenario
	for _, p := range points {
		for _, f := range faults {
			f.Unit, f.Node, f.Trigger, f.VM = UnitControlPlane, p.node, "park "+p.point, vmA
			speed := "nightly"
			if f.Kind == "sigkill-main" {
				speed = "slow"
			}
			who := "node A"
			if p.node == NodeB {
				who = "node B"
			}
			sc := Scenario{
				ID: "mig-cp-" + f.Kind + "-at-" + p.short, SeedRef: "issue 34 control plane", Op: OpMigrate, Speed: speed,
				Title: f.Kind + " of the control plane's process while " + who + " is parked at " + p.point + " of vm-a's migration: the agents ride through (keep what they run), the control plane comes back with its state, and the migration resumes and ends with vm-a live on node B alone with its RAM",
				Setup: placedA, Act: []Step{{Kind: StepMigrate, VM: vmA, Node: NodeB}},
				Faults: []Fault{f},
				After:  []Step{{Kind: StepAwaitMigrated, VM: vmA, Node: NodeB}},
				Env:    migrateEnv,
			}
			if f.Kind == "sigkill-main" && p.node == "" {
				sc.Targets = []string{"controlplane-state-in-memory"}
			}
			out = append(out, sc)
		}
	}
	return out
}

// migrateNetScenarios: the network between the nodes and the registry
// during a migration. In a net-fault cluster case every node runs in the
// case's node namespace (stack.Options.SharedNet) and reaches the registry
// through its veth pair, so a partition or an impairment of it hits the
// source's push and the target's pull alike: cut while node A's push has
// its blobs up and its manifest uncommitted (the release must wait for the
// commit), and cut, delayed or lossy while node B's pull has read the
// manifest (loss: nightly). Each fault lasts 20 s (scaled) and heals before the final
// check; converge_after_heal_ms says how long the cluster took after it.
func migrateNetScenarios() []Scenario {
	type cell struct {
		kind, node, point, short, speed string
	}
	cells := []cell{
		{injector.FaultNetPartition, "", pointPushBlobs, "source-push", "slow"},
		{injector.FaultNetPartition, NodeB, pointPullManifest, "target-pull", "slow"},
		// loss falls back on an nftables rule where the kernel has no
		// netem; delay has no fallback, and a case not run there would
		// leave `run --label-filter op:migrate` inconclusive: the
		// single-node net-cycle-delay covers delay
		{injector.FaultNetLoss, NodeB, pointPullManifest, "target-pull", "nightly"},
	}
	var out []Scenario
	for _, c := range cells {
		f := netFault(c.kind, c.point)
		f.Node = c.node
		who := "node A's push has its blobs up and its manifest uncommitted"
		if c.node == NodeB {
			who = "node B's pull has read vm-a's manifest and downloaded no blob"
		}
		out = append(out, Scenario{
			ID: "mig-" + c.kind + "-at-" + c.short, SeedRef: "issue 34 network", Op: OpMigrate, Speed: c.speed,
			Title: c.kind + " between the nodes and the registry for 20 s (scaled) while " + who + ": no release before the commit, no fresh boot, and once the path healed vm-a is live on node B alone with its RAM",
			Setup: placedA, Act: []Step{{Kind: StepMigrate, VM: vmA, Node: NodeB}},
			Faults: []Fault{f},
			After:  []Step{{Kind: StepAwaitMigrated, VM: vmA, Node: NodeB}},
			Env:    migrateEnv,
			Expect: Expect{FailedOK: c.kind == injector.FaultNetPartition},
			Labels: []string{LabelNet},
		})
	}
	return out
}
