// Package scenarios is the chaos catalogue as data: one Scenario value per
// field-report path or sweep, walked by the Ginkgo suite (scenarios/suite) and
// by `vmchaos run/sweep/bisect/repro/selftest` (scenarios/runner). Durations in
// this table are real-time values; the runner multiplies them by the run's
// time scale, so a fast run explores the same windows as a real-time one.
package scenarios

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
)

// Operations a scenario interrupts (label op:...).
const (
	OpCreate    = "create"
	OpClone     = "clone"
	OpSave      = "save"
	OpHibernate = "hibernate"
	OpWake      = "wake"
	OpDelete    = "delete"
)

// Step kinds. Setup steps run (and wait for their goal) before the fault is
// armed; Act steps start the interrupted operation; WhileStopped steps run
// between a `stop` fault and the operator's start.
const (
	StepCreate       = "create"        // PUT {snapshot: base}
	StepHibernate    = "hibernate"     // PUT {hibernate: true}
	StepWake         = "wake"          // PUT {hibernate: false}
	StepDelete       = "delete"        // DELETE
	StepLedgerWrite  = "ledger-write"  // write disk+RAM markers into the guest, record its boot id
	StepDirectClone  = "direct-clone"  // the harness runs `vmctl vm clone --name VM base` itself (no agent)
	StepReconcile    = "reconcile"     // the harness runs `vmctl vm reconcile-stale-create` on VM's record
	StepKillVMM      = "kill-vmm"      // SIGKILL the VM's cloud-hypervisor (the way an OOM kill does)
	StepWipeStatus   = "wipe-status"   // delete the agent's local status markers (agent stopped)
	StepCounterClaim = "counter-claim" // PUT a counter-intent inside a resume claim; expect the 4xx, retry until accepted
	StepDirectSave   = "direct-save"   // the harness runs `vmctl snapshot save --name VM-manual VM` itself (an operator's manual save)
	StepOrphanPause  = "orphan-pause"  // a harness `snapshot save` of VM SIGKILLed inside its pause window: the VMM stays Paused under a running record
	StepHoldLease    = "hold-lease"    // a harness `vm clone --name reader VM` parked at vm.clone.reserved holds snapshot VM's lease shared until the agent's next `snapshot rm` exited
	// StepDirectVmctl: the harness runs `vmctl ARGS` itself (Step.Args, a
	// verb of the manager run by itself, no agent); with Wait (setup) it
	// waits for its exit 0
	StepDirectVmctl = "direct-vmctl"
	// StepRestartAgent: the operator restarts the agent unit (not waited
	// for); the case's rules at the agent's startup points (StartupPoints)
	// go to this incarnation only, so the armed agent does not hit them
	StepRestartAgent = "restart-agent"
	// ArgImage in a direct-vmctl step's Args is the run's guest disk image
	// (what `vm create` boots).
	ArgImage = "{image}"
)

// Step is one harness action on one VM name.
type Step struct {
	Kind string
	VM   string // intent / VM name
	N    int    // create: how many VMs (names VM-0..VM-N-1); 0 = just VM
	Wait bool   // wait for the intent's goal (setup steps always wait)
	// Image (wake-image) is the intent's source snapshot: the image the VM
	// is asked to run now (catalogue_registry.go).
	Image string
	// Node (place, migrate) is the cluster node the control plane places
	// the VM on (catalogue_migrate.go).
	Node string
	// Args (direct-vmctl) are the vmctl arguments, VMs and snapshots by
	// name; ArgImage stands for the run's guest disk image.
	Args []string
	// Refused is a refusal the case expects: a direct-vmctl (with Wait)
	// must exit non-zero with this text in its output; an expect-parked
	// must park failed with it in its message.
	Refused string
}

// Fault is one injection: an injector fault kind fired by an injector trigger.
type Fault struct {
	Kind string // injector fault: sigkill-main | stop | restart | kill-all | sigkill-child | sigkill-vmm | sigstop | sigcont; "failpoint" = a VMCHAOS_FAILPOINTS action (Env.Failpoints) whose hit is the injection
	Unit string // "agent" (default) | "daemon"
	// Trigger is injector.ParseTrigger syntax WITHOUT the offset ("at
	// vm.clone.reserved", "park snapshot.save.paused", "after-exit
	// snapshot-save"); the case's offset is appended. "now" fires right
	// after the Act steps (plus the offset).
	Trigger string
	VM      string // VM name: of the trigger for agent points ("@vm=NAME"); the victim for sigkill-vmm
	Child   string // sigkill-child: kind of the agent child to kill ("snapshot-save", "vm-clone")
	// Window is the closed window the fault must land in: after Window[0]
	// was hit and before Window[1] was hit (an operation in flight). Every
	// at, after-exit and failpoint trigger names both ends (Validate); a
	// park's window is its parked point, a "now" fault's steady state.
	Window [2]string
	// ReleaseAfter (park only): keep the parked process parked until the n-th
	// hit of this point after the fault (or a child running ReleaseAfterChild
	// exited), then release it. Empty: release right after the fault.
	ReleaseAfter      string
	ReleaseAfterChild string
	StopFor           time.Duration // stop: how long the unit stays stopped before the operator starts it
	// Node (cluster cases, park triggers): the node whose agent's trace the
	// trigger reads and whose armed agent parks at the point, e.g. NodeB
	// for a phase of a migration's wake on its target; "" is the case's
	// own (first) node. Unit still says which process the fault hits.
	Node string
}

// MetricExpect is an expected counter delta over the case (after − before).
type MetricExpect struct {
	Series string // e.g. `nodeagent_stale_create_reconcile_total{outcome="busy"}`
	Min    float64
	Max    float64 // <0: unbounded
}

// Expect is what must hold once the stack converged.
type Expect struct {
	FailedOK                  bool // a transient `failed` is part of the story; the intent must still leave it by itself
	NoFailedWrite             bool // lifecycle failed must never be written after the fault (seed 001 #3 fix: 1 attempt, 0 failed)
	SaveRejectedBeforeCapture bool // a save refused for a held name must be refused before it paused/captured the VM
	Events                    bool // run a `vm status --event` observer; every VMM death must be observed as an event
	Ledger                    bool // verify the ledger after the final wake (RAM markers and boot id too)
	Workload                  bool // the workload cut is compulsory even where JudgesCut would not say so; it already is wherever a guest writes and the case takes a snapshot
	Adopted                   bool // VMs that existed before the fault keep their ids (adopted, never recreated)
	MACKept                   bool // a wake (or a create after a delete) reuses the MACs the name's VM had before (tap mode: mac-kept)
	Metrics                   []MetricExpect
	DirectVMs                 []string      // harness-created VM names that must exist exactly once and run
	Budget                    time.Duration // convergence budget (real time; scaled, with a floor)
}

// Env is what the stack of this scenario runs with.
type Env struct {
	RestartDelay time.Duration // agent unit RestartSec (real time); 0 = 5s as packaged
	AgentFlags   []string      // extra nodeagent flags
	Failpoints   string        // extra VMCHAOS_FAILPOINTS actions (besides the park of a park trigger)
	Daemon       bool          // run `vmctl daemon` as a unit
	DaemonEvery  time.Duration // its --interval (real time)
	DaemonArmed  bool          // the case's failpoints go to the daemon alone, started after the arm (its own points: its pass, its commits)
	Registry     string        // "oci": a real OCI registry (distribution server) for the case; "": the agent's registry dir
	// NetMode "tap": vmctl's tap mode on the fake backend (a TAP per NIC
	// whose MAC and id the VM's name keeps, so a wake reuses them as in
	// the field); "": fake mode (a MAC per VM id, fresh on every clone).
	NetMode string
	// FakeCHTiming overlays fakech's timing for the case's fake VMMs
	// (FAKECH_TIMING's JSON, fakech/timing.go), e.g. a guest that acks
	// an eject at once; the real backend ignores it.
	FakeCHTiming string
	// Nodes is the case's cluster size: 2 or more runs one node stack per
	// node and the control plane the agents sync against
	// (catalogue_migrate.go, docs/controlplane.md); 0 or 1: one node, no
	// control plane.
	Nodes int
}

// ejectAckAtOnce is a fake guest that takes up an eject's ack as soon as
// the VMM notified it (fakech's EjectAck: 0 of running time).
const ejectAckAtOnce = `{"eject_ack": 0}`

// NetModeTap is Env.NetMode's tap mode.
const NetModeTap = "tap"

// Scenario is one catalogue entry; with Offsets or Sweep it expands to one
// case per offset.
type Scenario struct {
	ID      string
	Title   string
	SeedRef string // "000", "001 #1", "002", "gap" ...
	Op      string
	Setup   []Step
	Act     []Step
	Faults  []Fault
	// WhileStopped runs between the fault and the agent's return: before
	// the operator's start after a `stop`, otherwise right after the
	// injection (within RestartSec).
	WhileStopped []Step
	// After runs once the operator restored service (e.g. the wake of a
	// VM whose agent lost its status markers, or a counter-intent).
	After   []Step
	Offsets []time.Duration // one case per offset (added to the first fault's trigger)
	// MaxPlace is how far into its measured window a fixed offset may sit
	// (a fraction; 0: the runner's 60 %, the headroom a faster run needs)
	MaxPlace  float64
	Sweep     string   // coarse sweep (injector.ParseSweep syntax), speed:fast
	FineSweep string   // fine sweep, speed:slow
	Speed     string   // speed:fast|slow of the non-sweep cases
	Backends  []string // backends it runs on (default fake)
	Env       Env
	Expect    Expect
	Targets   []string // regress bug names this scenario must catch
	Labels    []string // extra labels
	// Mgr makes the scenario a manager-verb case (manager_cases.go): the
	// runner drives the manager's own verbs through its adapter.
	Mgr *MgrCase
}

// Catalogue is every scenario, hand-written ones first, then the generated
// park cases. The seed scenarios also carry backend:real (they skip with the
// preflight's reason where there is no KVM).
var Catalogue = append(append(withReal(seedScenarios), parkScenarios()...), workloadScenarios()...)

func withReal(ss []Scenario) []Scenario {
	out := append([]Scenario{}, ss...)
	for i := range out {
		if out[i].SeedRef != "sweep" && len(out[i].Backends) == 0 {
			out[i].Backends = []string{"fake", "real"}
		}
	}
	return out
}

const (
	vmA = "vm-a"
	vmB = "vm-b"
)

var (
	createA    = Step{Kind: StepCreate, VM: vmA, Wait: true}
	ledgerA    = Step{Kind: StepLedgerWrite, VM: vmA}
	hibernateA = Step{Kind: StepHibernate, VM: vmA, Wait: true}
	readyA     = []Step{createA, ledgerA}
	hibernated = []Step{createA, ledgerA, hibernateA}
)

var seedScenarios = []Scenario{
	// ---- seed 001: the five stranding paths -------------------------------
	{
		ID: "s001-1-busy-create-orphan", SeedRef: "001 #1", Op: OpCreate, Speed: "fast",
		Title: "agent SIGKILLed while vm clone is in flight, back before the orphaned child dies: the busy watcher must re-invoke the verb",
		Act:   []Step{{Kind: StepCreate, VM: vmA}},
		Faults: []Fault{{Kind: "sigkill-main", Trigger: "park vm.clone.reserved",
			// the orphan stays alive (parked) until the restarted agent has
			// asked reconcile-stale-create once and was told busy
			ReleaseAfter: "agent.startup.reconciled"}},
		Env: Env{RestartDelay: 1 * time.Second},
		Expect: Expect{Metrics: []MetricExpect{
			{Series: `nodeagent_stale_create_reconcile_total{outcome="busy"}`, Min: 1, Max: -1},
			{Series: `nodeagent_stale_create_reconcile_total{outcome="collected"}`, Min: 1, Max: -1},
		}},
		Targets: []string{"watch-busy-inspect-only"},
	},
	{
		ID: "s001-2-stop-in-pause-window", SeedRef: "001 #2", Op: OpSave, Speed: "fast",
		Title:  "systemctl stop inside the pause window of a snapshot save leaves the VMM Paused: the resumed hibernate must converge the orphaned pause",
		Setup:  readyA,
		Act:    []Step{{Kind: StepHibernate, VM: vmA}},
		Faults: []Fault{{Kind: "stop", Trigger: "park snapshot.save.paused", StopFor: 2 * time.Second}},
		Expect: Expect{Ledger: true},
	},
	{
		ID: "s001-3-pending-holder", SeedRef: "001 #3", Op: OpSave, Speed: "fast",
		Title: "agent and its save child SIGKILLed after the pending record: the resumed save must be refused before capture and recover by rm <holder ID>",
		Setup: readyA,
		Act:   []Step{{Kind: StepHibernate, VM: vmA}},
		Faults: []Fault{
			{Kind: "sigkill-main", Trigger: "park snapshot.save.pending"},
			{Kind: "sigkill-child", Trigger: "park snapshot.save.pending", Child: "snapshot-save"},
		},
		Env:     Env{RestartDelay: 1 * time.Second},
		Expect:  Expect{SaveRejectedBeforeCapture: true, Ledger: true},
		Targets: []string{"save-match-already-exists-only", "save-rm-by-name", "save-preflight-ignores-pending"},
	},
	{
		ID: "s001-3-lease-held-holder", SeedRef: "001 #3", Op: OpSave, Speed: "fast",
		Title: "agent SIGKILLed while its save child is past the VM's ops lock (build lease and pending record held): the orphan still holds the lease when the resumed save's recovery runs rm <holder ID>; the refusal is transient, wait for the lease, no failed write",
		Setup: readyA,
		Act:   []Step{{Kind: StepHibernate, VM: vmA}},
		// a real dead save: vmctl holds the ops lock through pause, capture
		// and resume only (as cocoon does), so the orphan parked at pending
		// leaves the VM free for the restarted agent's vm start, while its
		// lease is still held; it goes on (and dies on its next write to the
		// dead agent's pipe, as in the field) once the agent's rm was refused
		Faults: []Fault{{Kind: "sigkill-main", Trigger: "park snapshot.save.pending", ReleaseAfterChild: "snapshot rm"}},
		Env:    Env{RestartDelay: 1 * time.Second},
		Expect: Expect{NoFailedWrite: true, Ledger: true, Metrics: []MetricExpect{
			{Series: `nodeagent_snapshot_save_total{result="failed"}`, Min: 1, Max: -1},
		}},
		Targets: []string{"save-no-lease-wait"},
	},
	{
		// The field killed the agent 6 s into a save that landed 2 s
		// later: three quarters into the save, placed in the save window
		// measured on the case's stack (a fixed 6 s scaled fell after the
		// end of the bundled stack's shorter save).
		ID: "s001-3-sigkill-6s-into-save", SeedRef: "001 #3", Op: OpSave, Speed: "slow",
		Title:  "SIGKILL of the agent three quarters into a snapshot save (the field's 6 s of 8 s), the field trigger",
		Setup:  readyA,
		Act:    []Step{{Kind: StepHibernate, VM: vmA}},
		Faults: []Fault{{Kind: "sigkill-main", Trigger: "at snapshot.save.locked", Window: [2]string{"snapshot.save.locked", "snapshot.save.finalized"}}},
		Sweep:  "75%",
		Env:    Env{RestartDelay: 5 * time.Second},
		Expect: Expect{Ledger: true},
	},
	{
		// The field's 28 ms after the save child exited fell inside the
		// push; scaled (1.4 ms at 0.05) it came before the agent had even
		// recorded the save. Placed a fifth into the push window measured
		// on the case's stack instead: the push is an export whose length
		// varies threefold from run to run (a run took 27-40 % of its
		// calibration), so half-way sometimes came after it.
		ID: "s001-3-sigkill-after-save-exit", SeedRef: "001 #3", Op: OpHibernate, Speed: "fast",
		Title:  "SIGKILL inside the push after the save child exited cleanly (field: 28 ms after the exit): the finalized holder is replaced, re-saved, re-pushed",
		Setup:  readyA,
		Act:    []Step{{Kind: StepHibernate, VM: vmA}},
		Faults: []Fault{{Kind: "sigkill-main", Trigger: "at agent.hibernate.saved", VM: vmA, Window: [2]string{"agent.hibernate.saved", "agent.hibernate.pushed"}}},
		Sweep:  "20%",
		Env:    Env{RestartDelay: 1 * time.Second},
		Expect: Expect{Ledger: true},
	},
	{
		// The agent's hibernate starts with the guest DHCP release over
		// SSH, which a Paused guest cannot answer: it must start the VM
		// first (vm start converges the orphaned pause).
		ID: "s001-2-orphaned-pause-then-hibernate", SeedRef: "001 #2", Op: OpHibernate, Speed: "fast",
		Title:  "a snapshot save SIGKILLed inside its pause window leaves the VMM Paused under a running record: the next hibernate's NIC drop must converge the orphaned pause",
		Setup:  readyA,
		Act:    []Step{{Kind: StepDirectSave, VM: vmA}},
		Faults: []Fault{{Kind: "sigkill-direct", Trigger: "park snapshot.save.paused"}},
		After:  []Step{{Kind: StepHibernate, VM: vmA}},
		Expect: Expect{Ledger: true},
		// the agent's resumed hibernate never redoes a done NIC drop, so the
		// orphaned pause reaches `vm net` only from a save the agent did not
		// own (an operator's, or a crashed earlier tool)
	},
	{
		ID: "s001-2-owed-nic-drop-on-paused-vm", SeedRef: "001 #2", Op: OpHibernate, Speed: "fast",
		Title:  "stop right after the hibernate's DHCP release; meanwhile a save dies inside its pause window: the resumed NIC drop must converge the orphaned pause",
		Setup:  readyA,
		Act:    []Step{{Kind: StepHibernate, VM: vmA}},
		Faults: []Fault{{Kind: "stop", Trigger: "park agent.hibernate.dhcp-released", VM: vmA, StopFor: 1 * time.Second}},
		// the guest was already told to release DHCP, so the resumed
		// hibernate goes straight to `vm net --nics 0` on the Paused VMM
		WhileStopped: []Step{{Kind: StepOrphanPause, VM: vmA}},
		Expect:       Expect{Ledger: true},
		Targets:      []string{"net-refuses-paused"},
	},
	{
		ID: "s001-4-owed-hibernate-dead-vmm", SeedRef: "001 #4", Op: OpHibernate, Speed: "fast",
		Title:        "stop during the NIC drop of a hibernate, kill -9 of the VMM before start: the resumed hibernate must boot the VM first",
		Setup:        readyA,
		Act:          []Step{{Kind: StepHibernate, VM: vmA}},
		Faults:       []Fault{{Kind: "stop", Trigger: "park agent.hibernate.begin", VM: vmA, StopFor: 1 * time.Second}},
		WhileStopped: []Step{{Kind: StepKillVMM, VM: vmA}},
		Expect: Expect{Ledger: false, Metrics: []MetricExpect{
			{Series: `nodeagent_startup_resume_total{op="hibernate"}`, Min: 1, Max: -1},
		}},
		Targets: []string{"resume-start-gated-on-listed-state"},
	},
	{
		ID: "s001-5-transient-failed", SeedRef: "001 #5", Op: OpHibernate, Speed: "fast",
		Title:  "a transient failure inside the hibernate writes failed: failed is a report, the intent must leave it by itself",
		Setup:  readyA,
		Act:    []Step{{Kind: StepHibernate, VM: vmA}},
		Faults: []Fault{{Kind: "failpoint", Trigger: "at agent.failed", Window: [2]string{"agent.hibernate.begin", "agent.hibernate.done"}}},
		// one failure of the agent's own step (the process outlives it, so
		// 1* makes it transient); with one attempt it is written failed
		Env: Env{Failpoints: "agent.hibernate.dhcp-released=1*error(transient DHCP release blip)@vm=" + vmA,
			AgentFlags: []string{"--retry-attempts=1"}},
		Expect:  Expect{FailedOK: true, Ledger: true},
		Targets: []string{"failed-sticky"},
	},

	// ---- seed 001: what held up ------------------------------------------
	{
		ID: "s001-h-create-restart", SeedRef: "001 held", Op: OpCreate, Speed: "fast",
		Title:  "create interrupted (vm clone in flight) + systemctl restart: record collected, VM recreated, exactly one VM, no orphan VM",
		Act:    []Step{{Kind: StepCreate, VM: vmA}},
		Faults: []Fault{{Kind: "restart", Trigger: "park vm.clone.vmm-launched"}},
		Expect: Expect{Metrics: []MetricExpect{
			{Series: `nodeagent_stale_create_reconcile_total{outcome="collected"}`, Min: 1, Max: -1},
			{Series: `nodeagent_orphan_vm_total`, Min: 0, Max: 0},
		}},
	},
	{
		ID: "s001-h-delete-restart-144ms", SeedRef: "001 held", Op: OpDelete, Speed: "fast",
		Title:   "delete interrupted 144 ms in + restart: VM and intent gone, unrelated snapshots untouched",
		Setup:   readyA,
		Act:     []Step{{Kind: StepDelete, VM: vmA}},
		Faults:  []Fault{{Kind: "restart", Trigger: "at agent.delete.begin", Window: [2]string{"agent.delete.begin", "agent.delete.done"}}},
		Offsets: []time.Duration{144 * time.Millisecond},
		// the field's 144 ms is 7.2 ms at scale 0.05, 45-65 % of a
		// delete measured at 11.0-16 ms: past the default 60 % about one
		// run in five (CI went inconclusive on two readings of 11.5 and
		// 11.8 ms); placed runs cleared the window's end by 3.9 ms or more
		MaxPlace: 0.7,
	},
	{
		// The resumed delete finds the tombstoned record gone by name: it
		// must still run vm rm, which rolls the tombstone forward and stops
		// the VMM, before it forgets the intent.
		ID: "s001-h-delete-restart-park", SeedRef: "001 held", Op: OpDelete, Speed: "fast",
		Title:  "delete interrupted exactly inside vm rm (tombstoned) + restart: VM and intent gone, unrelated snapshots untouched",
		Setup:  readyA,
		Act:    []Step{{Kind: StepDelete, VM: vmA}},
		Faults: []Fault{{Kind: "restart", Trigger: "park vm.rm.tombstoned"}},
	},
	{
		ID: "s001-h-wake-restart", SeedRef: "001 held", Op: OpWake, Speed: "fast",
		Title:  "wake interrupted by systemctl restart: recovered, guest state from the hibernate snapshot",
		Setup:  hibernated,
		Act:    []Step{{Kind: StepWake, VM: vmA}},
		Faults: []Fault{{Kind: "restart", Trigger: "park vm.clone.restored"}},
		Expect: Expect{Ledger: true},
		// the setup's create/hibernate counters are sampled before the
		// restarts: process-local metrics go backwards
		Targets: []string{"metrics-process-local"},
	},
	{
		ID: "s001-h-wake-sigkill-after-commit", SeedRef: "001 held", Op: OpWake, Speed: "fast",
		Title:   "wake interrupted by SIGKILL 28 ms after the clone committed: recovered through the NIC-drop classification",
		Setup:   hibernated,
		Act:     []Step{{Kind: StepWake, VM: vmA}},
		Faults:  []Fault{{Kind: "sigkill-main", Trigger: "at vm.clone.committed", Window: [2]string{"vm.clone.committed", "agent.wake.ready"}}},
		Offsets: []time.Duration{28 * time.Millisecond},
		Env:     Env{RestartDelay: 1 * time.Second},
		Expect:  Expect{Ledger: true},
	},
	{
		ID: "s001-h-post-clone-running", SeedRef: "001 held", Op: OpCreate, Speed: "fast",
		Title:  "post_clone=running at the restart is dispatched as post_clone work",
		Act:    []Step{{Kind: StepCreate, VM: vmA}},
		Faults: []Fault{{Kind: "sigkill-main", Trigger: "park agent.create.cloned", VM: vmA}},
		Env:    Env{RestartDelay: 1 * time.Second},
		Expect: Expect{Adopted: true, Metrics: []MetricExpect{
			{Series: `nodeagent_startup_resume_total{op="post_clone"}`, Min: 1, Max: -1},
		}},
	},
	{
		ID: "s001-h-double-restart", SeedRef: "001 held", Op: OpHibernate, Speed: "fast",
		Title: "double restart: the second process re-derives the same owed work; no double execution, no skipped work",
		Setup: readyA,
		Act:   []Step{{Kind: StepHibernate, VM: vmA}},
		Faults: []Fault{
			{Kind: "restart", Trigger: "park agent.hibernate.nic-dropped", VM: vmA},
			// the first reconcile after arming is the restarted agent's:
			// restart it again while it re-derives the owed hibernate
			{Kind: "restart", Trigger: "at agent.startup.reconciled", Window: [2]string{"agent.startup.reconciled", "agent.hibernate.done"}},
		},
		Expect: Expect{Ledger: true},
	},
	{
		ID: "s001-h-resume-claim-exclusion", SeedRef: "001 held", Op: OpHibernate, Speed: "fast",
		Title:  "a counter-operation inside a resume claim is rejected with `resumed operation still in flight` and succeeds on retry once released",
		Setup:  readyA,
		Act:    []Step{{Kind: StepHibernate, VM: vmA}},
		After:  []Step{{Kind: StepCounterClaim, VM: vmA}},
		Faults: []Fault{{Kind: "sigkill-main", Trigger: "park agent.hibernate.dhcp-released", VM: vmA}},
		Env:    Env{RestartDelay: 1 * time.Second},
	},
	{
		ID: "s001-h-ten-vms-adopted", SeedRef: "001 held", Op: OpCreate, Speed: "fast",
		Title:  "ten ready VMs are adopted at startup after a restart: nothing recreated, bounded fan-out",
		Setup:  []Step{{Kind: StepCreate, VM: "vm", N: 10, Wait: true}},
		Faults: []Fault{{Kind: "restart", Trigger: "now"}},
		Expect: Expect{Adopted: true},
	},

	// ---- seed 000 --------------------------------------------------------
	{
		ID: "s000-vmm-kill-event", SeedRef: "000", Op: OpCreate, Speed: "fast",
		Title:   "kill -9 of a VMM: the event stream reports it as MODIFIED stopped (stale) and the agent brings the VM back",
		Setup:   readyA,
		Faults:  []Fault{{Kind: "sigkill-vmm", Trigger: "now", VM: vmA}},
		Offsets: []time.Duration{500 * time.Millisecond},
		Expect:  Expect{Events: true, Ledger: false},
		Targets: []string{"event-stream-pointer-snapshot"},
	},

	// ---- seed 002 --------------------------------------------------------
	{
		ID: "s002-clone-sigkill-59ms-daemon", SeedRef: "002", Op: OpClone, Speed: "fast",
		Title:   "a vm clone SIGKILLed 59 ms (scaled) after its placeholder was written is collected by the vmctl daemon",
		Act:     []Step{{Kind: StepDirectClone, VM: "direct-x"}},
		Faults:  []Fault{{Kind: "sigkill-direct", Trigger: "at vm.clone.reserved", Window: [2]string{"vm.clone.reserved", "vm.clone.committed"}}},
		Offsets: []time.Duration{59 * time.Millisecond},
		Env:     Env{Daemon: true, DaemonEvery: 5 * time.Second},
	},
	{
		ID: "s002-clone-sigkill-59ms-agent", SeedRef: "002", Op: OpCreate, Speed: "fast",
		Title: "agent and its clone child SIGKILLed 59 ms after the placeholder: the agent's startup collects it and recreates",
		Act:   []Step{{Kind: StepCreate, VM: vmA}},
		Faults: []Fault{
			{Kind: "sigkill-child", Trigger: "at vm.clone.reserved", Child: "vm-clone", Window: [2]string{"vm.clone.reserved", "vm.clone.committed"}},
			{Kind: "sigkill-main", Trigger: "at vm.clone.reserved", Window: [2]string{"vm.clone.reserved", "vm.clone.committed"}},
		},
		Offsets: []time.Duration{59 * time.Millisecond},
		Env:     Env{RestartDelay: 1 * time.Second},
		Expect: Expect{Metrics: []MetricExpect{
			{Series: `nodeagent_stale_create_reconcile_total{outcome="collected"}`, Min: 1, Max: -1},
		}},
	},
	{
		ID: "s002-verb-spares-live-clone", SeedRef: "002", Op: OpClone, Speed: "fast",
		Title:   "reconcile-stale-create against a live in-flight clone answers busy and never deletes the VM the clone then commits",
		Act:     []Step{{Kind: StepDirectClone, VM: "direct-y"}, {Kind: StepReconcile, VM: "direct-y"}},
		Faults:  []Fault{{Kind: "none", Trigger: "park vm.clone.resumed", ReleaseAfter: "reconcile-started"}},
		Expect:  Expect{DirectVMs: []string{"direct-y"}},
		Targets: []string{"stale-create-blocking-lock"},
	},

	// ---- seed 001 coverage gap: never fresh-boot over a hibernate snapshot --
	{
		ID: "gap-wake-restores-snapshot", SeedRef: "001 gap", Op: OpWake, Speed: "fast",
		Title:  "a wake restores the hibernate snapshot (RAM markers and boot id survive), never fresh-boots over it",
		Setup:  hibernated,
		Act:    []Step{{Kind: StepWake, VM: vmA, Wait: true}},
		Faults: []Fault{{Kind: "none"}},
		Expect: Expect{Ledger: true},
	},
	{
		ID: "gap-wake-after-status-lost", SeedRef: "001 gap", Op: OpWake, Speed: "fast",
		Title:        "the agent lost its local status markers while hibernated: the wake still restores from the registry snapshot",
		Setup:        hibernated,
		Faults:       []Fault{{Kind: "stop", Trigger: "now", StopFor: 500 * time.Millisecond}},
		WhileStopped: []Step{{Kind: StepWipeStatus, VM: vmA}},
		After:        []Step{{Kind: StepWake, VM: vmA}},
		Expect:       Expect{Ledger: true},
	},
	{
		// vmctl starts each VMM in its own cgroup (CLONE_INTO_CGROUP), so
		// the unit's cgroup holds the agent and its vmctl children only: a
		// VMM that died here would cold-boot and lose its RAM markers
		ID: "s001-m-kill-all-spares-vmms", SeedRef: "001 method", Op: OpHibernate, Speed: "fast",
		Title:  "systemctl kill --kill-who=all of the agent's unit kills the agent and its children, never a VMM: the VM keeps its RAM through the next hibernate/wake",
		Setup:  readyA,
		Faults: []Fault{{Kind: "kill-all", Trigger: "now"}},
		After:  []Step{{Kind: StepHibernate, VM: vmA, Wait: true}, {Kind: StepWake, VM: vmA, Wait: true}},
		Env:    Env{RestartDelay: 1 * time.Second},
		Expect: Expect{Ledger: true},
	},

	// ---- sweeps across clone, save and hibernate --------------------------
	sweep("sweep-clone-sigkill", OpCreate, "sigkill-main", "at agent.create.begin", [2]string{"agent.create.begin", "agent.create.ready"}, nil, coarseFracs, fineFracs),
	sweep("sweep-clone-stop", OpCreate, "stop", "at agent.create.begin", [2]string{"agent.create.begin", "agent.create.ready"}, nil, coarseFracs, fineFracs),
	sweep("sweep-save-sigkill", OpSave, "sigkill-main", "at agent.hibernate.dhcp-released", [2]string{"agent.hibernate.dhcp-released", "agent.hibernate.saved"}, readyA, coarseFracs, fineFracs),
	sweep("sweep-save-stop", OpSave, "stop", "at agent.hibernate.dhcp-released", [2]string{"agent.hibernate.dhcp-released", "agent.hibernate.saved"}, readyA, coarseFracs, fineFracs),
	sweep("sweep-hibernate-sigkill", OpHibernate, "sigkill-main", "at agent.hibernate.begin", [2]string{"agent.hibernate.begin", "agent.hibernate.done"}, readyA, coarseFracs, fineFracs),
	sweep("sweep-hibernate-stop", OpHibernate, "stop", "at agent.hibernate.begin", [2]string{"agent.hibernate.begin", "agent.hibernate.done"}, readyA, coarseFracs, fineFracs),
}

// fineFracs is every fine sweep: fractions of the operation's window (the
// fault's Window), measured on each case's own stack by the runner, so the
// fine offsets cover the operation however fast the machine runs it. It
// stops at 85%: the swept run can be somewhat faster than the calibration
// (the window's tail is covered by the park cases at its last points).
const fineFracs = "5%..85%/5%"

// coarseFracs is every coarse sweep (speed:fast), in fractions of the
// window like the fine ones: absolute offsets sized for one machine's speed
// sat on the window's edge and flipped between pass and inconclusive with
// the load (issue #19). 50% keeps half the window between the fault and the
// end the calibration measured: on the shared 2-core box under heavy load
// (load average 15-28) a run's window came out down to 59% of the shorter of
// its two calibrations, and at 60% 2 of 90 last-fraction runs landed after
// the end. The fine sweeps (speed:slow) and the park cases cover the rest.
//
// One fraction per sweep (issue 37, CI stays fast): 10% and 30% were the
// same fault kind on the same operation from the same trigger point as 50%,
// and at 10% it landed where fast park cases already are (sigkill-main at
// agent.create.begin: s001-obs-evidence-resumed). 50% lands deepest into the
// operation, past the points the fast park cases hold, and keeps the
// window's headroom under test in CI and `make stability`; 10% and 30% stay
// in `make chaos` as part of the fine sweep.
const coarseFracs = "50%"

// sweep builds an offset sweep over one operation: the fault fires OFFSET
// after the operation's first point and must land before its last (else the
// case is inconclusive: the fault hit a finished operation). Both the coarse
// and the fine sweep are in fractions of the window (FROM%..TO%/STEP% or a
// list), resolved per case on its stack (see runner.placeFault).
func sweep(id, op, fault, trigger string, window [2]string, setup []Step, coarse, fine string) Scenario {
	act := StepCreate
	if op == OpSave || op == OpHibernate {
		act = StepHibernate
	}
	f := Fault{Kind: fault, Trigger: trigger, VM: vmA, Window: window}
	if fault == "stop" {
		f.StopFor = 1 * time.Second
	}
	return Scenario{
		ID: id, SeedRef: "sweep", Op: op,
		Title:     fmt.Sprintf("%s at every offset across %s (%s → %s)", fault, op, window[0], window[1]),
		Setup:     setup,
		Act:       []Step{{Kind: act, VM: vmA}},
		Faults:    []Fault{f},
		Sweep:     coarse,
		FineSweep: fine,
		Env:       Env{RestartDelay: 1 * time.Second},
		Expect:    Expect{Ledger: op != OpCreate},
	}
}

// parkOps maps the failpoint catalogue's operations to the agent operation
// that drives them, for the generated park cases.
var parkOps = map[string]string{"clone": OpCreate, "create": OpCreate, "save": OpSave, "hibernate": OpHibernate,
	"net": OpHibernate, "rm": OpHibernate} // a hibernate drops the NIC with `vm net` and ends with `vm rm`

// parkScenarios generates one case per (vmctl or agent point of clone, save,
// hibernate) × (sigkill-main, stop): exact and deterministic landings.
func parkScenarios() []Scenario {
	var out []Scenario
	for _, p := range failpoint.Catalogue {
		op, ok := parkOps[p.Op]
		if !ok || (p.Proc != "vmctl" && p.Proc != "nodeagent") || p.Name == "vm.create.reserved" || p.Name == "vm.create.committed" || p.Name == "vm.create.created" {
			continue
		}
		for _, fault := range []string{"sigkill-main", "stop"} {
			s := Scenario{
				ID:      "park-" + strings.ReplaceAll(p.Name, ".", "-") + "-" + fault,
				Title:   fmt.Sprintf("%s while parked at %s (%s)", fault, p.Name, p.Happened),
				SeedRef: "sweep", Op: op, Speed: "slow",
				Faults: []Fault{{Kind: fault, Trigger: "park " + p.Name}},
				Env:    Env{RestartDelay: 1 * time.Second},
				Labels: []string{"trigger:park"},
			}
			if fault == "stop" {
				s.Faults[0].StopFor = 1 * time.Second
			}
			if p.Proc == "nodeagent" {
				s.Faults[0].VM = vmA
			}
			if op == OpCreate {
				s.Act = []Step{{Kind: StepCreate, VM: vmA}}
			} else {
				s.Setup = readyA
				s.Act = []Step{{Kind: StepHibernate, VM: vmA}}
				s.Expect.Ledger = true
			}
			out = append(out, s)
		}
	}
	return out
}

// Lookup returns the scenario with that id.
func Lookup(id string) (*Scenario, bool) {
	for i := range Catalogue {
		if Catalogue[i].ID == id {
			return &Catalogue[i], true
		}
	}
	return nil, false
}

// Backends the scenario runs on.
func (s *Scenario) BackendList() []string {
	if len(s.Backends) == 0 {
		return []string{"fake"}
	}
	return s.Backends
}

// ScenariosTargeting returns the ids of scenarios whose Targets name bug.
func ScenariosTargeting(bug string) []string {
	var out []string
	for _, s := range Catalogue {
		for _, t := range s.Targets {
			if t == bug {
				out = append(out, s.ID)
			}
		}
	}
	return out
}

// SortedIDs returns every scenario id, sorted.
func SortedIDs() []string {
	out := make([]string, 0, len(Catalogue))
	for _, s := range Catalogue {
		out = append(out, s.ID)
	}
	sort.Strings(out)
	return out
}

// ---- CH fidelity (issue 14): windows fakech reproduces from CH's source --
//
// vm.remove-device only asks the guest to eject; CH keeps the device in its
// device tree until the guest acks, checks new ids against that tree, and a
// snapshot carries it (docs/fakech.md, conformance table). These cases park
// the guest's ack (ch.eject.acked) or the snapshot's memory write inside the
// fake VMM, so they run on the fake backend only.
func init() { Catalogue = append(Catalogue, chFidelityScenarios...) }

// armedHibernate creates the VM after the stack was armed, so its VMM (a
// process that outlives the setup's agent) carries the park of a ch.* point,
// then writes the ledger and starts the hibernate.
var armedHibernate = []Step{createA, ledgerA, {Kind: StepHibernate, VM: vmA}}

var chFidelityScenarios = []Scenario{
	{
		ID: "ch-eject-pending-hibernate-save", SeedRef: "ch14", Op: OpHibernate, Speed: "fast", Backends: []string{"fake"}, Labels: []string{"ch:fidelity"},
		Title: "the guest holds the eject of a hibernate's NIC drop pending: the save must wait until CH's device tree no longer holds the NIC (vm net fails 'eject pending', the agent runs it again) and the wake keeps the guest's RAM",
		Act:   armedHibernate,
		// held until the first vm net gave up on its budget
		Faults: []Fault{{Kind: "none", Trigger: "park ch.eject.acked", ReleaseAfterChild: "vm-net"}},
		After:  []Step{{Kind: StepWake, VM: vmA, Wait: true}},
		Expect: Expect{Ledger: true},
	},
	{
		ID: "ch-eject-pending-sigkill-agent", SeedRef: "ch14", Op: OpHibernate, Speed: "fast", Backends: []string{"fake"}, Labels: []string{"ch:fidelity"},
		Title:  "agent SIGKILLed while the eject of the hibernate's NIC drop is pending: the resumed hibernate waits for the same eject (kept in the VM record) before it saves",
		Act:    armedHibernate,
		Faults: []Fault{{Kind: "sigkill-main", Trigger: "park ch.eject.acked", ReleaseAfter: "agent.startup.reconciled"}},
		Env:    Env{RestartDelay: 1 * time.Second},
		Expect: Expect{Ledger: true},
	},
	{
		ID: "ch-eject-pending-stop-agent", SeedRef: "ch14", Op: OpHibernate, Speed: "fast", Backends: []string{"fake"}, Labels: []string{"ch:fidelity"},
		Title:  "systemctl stop while the eject of the hibernate's NIC drop is pending (the vm net child dies with the agent): the resumed hibernate waits for it before it saves",
		Act:    armedHibernate,
		Faults: []Fault{{Kind: "stop", Trigger: "park ch.eject.acked", StopFor: 1 * time.Second, ReleaseAfter: "agent.startup.reconciled"}},
		Expect: Expect{Ledger: true},
	},
	{
		ID: "ch-clone-restored-tree-holds-nic", SeedRef: "ch14", Op: OpClone, Speed: "fast", Backends: []string{"fake"}, Labels: []string{"ch:fidelity"},
		Title:  "a clone's restored device tree still holds the snapshot source's NIC (CH neither removes it nor frees its id): the clone must add its NIC under an id the tree does not hold",
		Act:    []Step{{Kind: StepDirectClone, VM: "direct-t"}},
		Faults: []Fault{{Kind: "none", Trigger: "park vm.clone.restored"}},
		Expect: Expect{DirectVMs: []string{"direct-t"}},
	},
	{
		// The guest acks the eject 300 ms (real time, not scaled) after
		// it was asked: inside vm net's eject budget, so the fixed vm net
		// waits it out, and longer than the hibernate takes from its NIC
		// drop to its save's pause, so a vm net that does not wait lets
		// the save capture the half-gone NIC (issue 31, item 6). The
		// guest takes up the ack at once (eject_ack 0: ch.eject.acked is
		// hit as the request returns) and the sleep at that hit is the
		// 300 ms: with fakech's default 15 ms of running time before the
		// hit, a vm net that did not wait saw the hibernate pause, resume
		// and remove the VM first under load (selftest-fast, 12 with-bug
		// cases at once), the hit never came and the case proved nothing.
		ID: "ch-net-eject-wait-hibernate-wake", SeedRef: "ch14", Op: OpHibernate, Speed: "fast", Backends: []string{"fake"}, Labels: []string{"ch:fidelity"},
		Title:   "the guest acks the eject of the hibernate's NIC drop late: vm net must wait for it, so the save captures no half-gone NIC and the woken VM's device tree holds no node without a device (device-tree-consistent)",
		Act:     armedHibernate,
		Faults:  []Fault{{Kind: "failpoint", Trigger: "at ch.eject.acked", Window: [2]string{"agent.hibernate.begin", "agent.hibernate.done"}}},
		Env:     Env{Failpoints: "ch.eject.acked=1*sleep(300)", FakeCHTiming: ejectAckAtOnce},
		After:   []Step{{Kind: StepWake, VM: vmA, Wait: true}},
		Expect:  Expect{Ledger: true},
		Targets: []string{"net-skips-eject-wait"},
	},
	{
		// The same late ack, the intent left hibernated: the snapshot the
		// save took stays in the store, so its captured tree is judged.
		ID: "ch-net-eject-wait-hibernate", SeedRef: "ch14", Op: OpHibernate, Speed: "fast", Backends: []string{"fake"}, Labels: []string{"ch:fidelity"},
		Title:   "the guest acks the eject of the hibernate's NIC drop late: the hibernate snapshot's captured device tree must hold no NIC with its eject pending (device-tree-consistent on state.json)",
		Act:     armedHibernate,
		Faults:  []Fault{{Kind: "failpoint", Trigger: "at ch.eject.acked", Window: [2]string{"agent.hibernate.begin", "agent.hibernate.done"}}},
		Env:     Env{Failpoints: "ch.eject.acked=1*sleep(300)", FakeCHTiming: ejectAckAtOnce},
		Targets: []string{"net-skips-eject-wait"},
	},
	// Tap mode on the fake backend (issue 31, item 6): the VM's name keeps
	// its TAP slots, so a wake (a clone under the same name) and a create
	// after a delete reuse the NIC's MAC and its MAC-derived id, as the
	// field's hibernate → wake does; fakech's guest answers at the guest
	// address the MAC derives from the case's loopback pool.
	{
		ID: "ch-tap-hibernate-wake-mac-reuse", SeedRef: "ch14", Op: OpWake, Speed: "fast", Backends: []string{"fake"}, Labels: []string{"ch:fidelity", "net:tap"},
		Title:  "tap mode: hibernate → wake brings the NIC back with the same MAC and id; the woken VM's device tree holds no node of the hibernated NIC (device-tree-consistent, mac-kept)",
		Act:    armedHibernate,
		Faults: []Fault{{Kind: "none"}},
		After:  []Step{{Kind: StepWake, VM: vmA, Wait: true}},
		Env:    Env{NetMode: NetModeTap},
		Expect: Expect{Ledger: true, MACKept: true},
	},
	{
		ID: "ch-tap-net-eject-wait-hibernate-wake", SeedRef: "ch14", Op: OpHibernate, Speed: "fast", Backends: []string{"fake"}, Labels: []string{"ch:fidelity", "net:tap"},
		Title:   "tap mode, the guest acks the eject of the hibernate's NIC drop late: vm net must wait for it, or the save captures the NIC and the wake, reusing its MAC, finds its id taken by a node no device stands behind",
		Act:     armedHibernate,
		Faults:  []Fault{{Kind: "failpoint", Trigger: "at ch.eject.acked", Window: [2]string{"agent.hibernate.begin", "agent.hibernate.done"}}},
		Env:     Env{Failpoints: "ch.eject.acked=1*sleep(300)", NetMode: NetModeTap, FakeCHTiming: ejectAckAtOnce},
		After:   []Step{{Kind: StepWake, VM: vmA, Wait: true}},
		Expect:  Expect{Ledger: true, MACKept: true},
		Targets: []string{"net-skips-eject-wait"},
	},
	{
		ID: "ch-tap-recreate-mac-reuse", SeedRef: "ch14", Op: OpCreate, Speed: "fast", Backends: []string{"fake"}, Labels: []string{"ch:fidelity", "net:tap"},
		Title:  "tap mode: a VM deleted and created again under its name is a clone of the base snapshot that reuses the deleted VM's MAC and NIC id (device-tree-consistent, mac-kept)",
		Setup:  []Step{createA},
		Act:    []Step{{Kind: StepDelete, VM: vmA, Wait: true}, createA},
		Faults: []Fault{{Kind: "none"}},
		Env:    Env{NetMode: NetModeTap},
		Expect: Expect{MACKept: true},
	},
	{
		ID: "ch-kill9-mid-snapshot", SeedRef: "ch14", Op: OpSave, Speed: "fast", Backends: []string{"fake"}, Labels: []string{"ch:fidelity"},
		Title:  "kill -9 of the VMM while CH writes memory-ranges (config.json and state.json already complete): the debris must never become a ready snapshot, and the hibernate converges",
		Act:    armedHibernate,
		Faults: []Fault{{Kind: "sigkill-vmm", Trigger: "park ch.snapshot.memory-writing", VM: vmA}},
		// the VMM died: its RAM is legitimately gone
		Expect: Expect{Ledger: false, FailedOK: true},
	},
}
