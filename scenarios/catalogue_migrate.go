package scenarios

import "time"

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
)

// Harness steps of the cluster cases (runner/cluster.go).
const (
	StepPlace   = "place"   // put VM {snapshot: base, node: Node} on the control plane; with Wait: until Node's agent has it ready
	StepMigrate = "migrate" // move VM's placement to Node; with Wait: until Node's agent has it ready and no other node holds it
	// StepExpectParked waits until the case's own node reports VM failed
	// with its automatic retries exhausted: a leftover failed.
	StepExpectParked = "expect-parked"
)

func init() {
	for _, k := range []string{StepPlace, StepMigrate, StepExpectParked} {
		StepKinds[k] = true
	}
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
		Targets: []string{"migrate-release-before-push", "migrate-target-skips-release"},
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
	for i := range out {
		out[i].Backends = []string{"fake"}
		out[i].Labels = append(out[i].Labels, LabelRegistryOCI)
	}
	return out
}
