// Package checker is the convergence checker (docs/architecture.md §9): after a
// fault, the stack must reach a state where every invariant below holds for
// several consecutive polls, by itself. Every invariant is a named entry in a
// table and reports evidence when it fails; the names are the ones the
// regress table (regress.Bugs[].Invariant) refers to.
//
// The checker reads the stack only through black-box outputs: the manager's
// `-o json` verbs and its own check report (through manager.Observer), the
// agent's HTTP API, the agent's registry, the guest over SSH, /metrics parsed
// with expfmt, and /proc. Every invariant names the data sources it reads; a
// source that errored makes the invariant fail with the error as evidence,
// never pass.
package checker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios/stack"
)

// Invariant names. The state invariants are polled until stable; the
// history invariants are judged once, at the end, over the whole case.
const (
	IntentGoal            = "intent-goal"
	OneVMPerName          = "one-vm-per-name"
	NoOrphanCreating      = "no-orphan-creating"
	NoOrphanVMM           = "no-orphan-vmm"
	NoRunningWithDeadVMM  = "no-running-with-dead-vmm"
	NoPausedRunning       = "no-paused-running"
	NoPendingWithoutLease = "no-pending-without-lease"
	NoTombstone           = "no-tombstone"
	IndexesConsistent     = "indexes-consistent"
	NoVmctlChild          = "no-vmctl-child"
	NoLeftoverSockets     = "no-leftover-sockets"
	NoLeftoverStaging     = "no-leftover-staging"
	NoUnreferencedDirs    = "no-unreferenced-dirs"
	BaseSnapshotKept      = "unrelated-snapshots-untouched"
	VMsAdopted            = "vms-adopted"

	LedgerClean               = "ledger-clean"
	MetricsMonotonic          = "metrics-monotonic"
	MetricExpectations        = "metric-expectations"
	EventsObserved            = "events-observed"
	NoFailedWrite             = "no-failed-write"
	SaveRejectedBeforeCapture = "save-rejected-before-capture"
	FaultLanded               = "fault-landed"
	Stable                    = "converged-and-stable"
)

// Goal values.
const (
	GoalReady      = "ready"
	GoalHibernated = "hibernated"
	GoalDeleted    = "deleted"
)

// Input is what the checker compares the stack against.
type Input struct {
	Stack      *stack.Stack
	Manager    manager.Observer  // nil: Stack.ManagerObserver()
	Goals      map[string]string // intent name → ready|hibernated|deleted
	Generation map[string]int64  // intent name → generation the harness last set (0: unknown)
	DirectVMs  []string          // harness-created VMs that must exist once and run
	AdoptedIDs map[string]string // name → VM id before the fault (Expect.Adopted; nil: not asked)
	// AdoptedErr: the baseline of AdoptedIDs could not be read (vms-adopted
	// then fails: no baseline, nothing proven).
	AdoptedErr error
	BaseName   string // snapshot every intent clones from: never removed
	// Registry is the agent's registry dir: a hibernated intent's snapshot
	// must be pushed there and readable ("": Stack.Registry).
	Registry string
	// BootID asks the guest at addr (VM name) for its boot id over SSH: a
	// ready intent's guest must answer. nil: Stack.GuestBootID; without
	// either no ready intent can be proven ready.
	BootID func(ctx context.Context, name, addr string) (string, error)
	// TraceLoss is nil when the trace is complete; otherwise why it is not
	// (datagrams lost or malformed, the socket gone). Every invariant judged
	// from the trace refuses to pass while it is set.
	TraceLoss error

	// Procs scans the case's processes (nil: Stack). A manager case has no
	// stack: its scanner finds the processes carrying the case's tag.
	Procs ProcScanner
	// Agentless: the case runs no agent (a manager case, black-box mode):
	// the agent API is not read and intent-goal is not asked.
	Agentless bool
	// Quiescent: no operation of the case can be in flight while it is
	// polled (a manager case after its recovery: every verb the harness
	// started has exited, and nothing else drives the manager). A creating
	// record, a pending snapshot or a VMM under a non-running record then
	// has no owner left, whoever holds a lock.
	Quiescent bool
	// InFlight, set where the manager exposes no per-VM ops lock (cocoon
	// locks its whole index), picks the manager verbs in flight among the
	// case's processes: its verbs, not its long-running event stream, not
	// the harness's own reads. A poll that finds none is quiescent like a
	// Quiescent case: whatever the records say, no verb is left to own a
	// creating record, a pending snapshot or a VMM under a stopped record.
	InFlight func([]stack.Proc) []stack.Proc
	// Without are sources the manager does not expose (its Observer says
	// manager.ErrNotSupported, e.g. no check verb): an invariant that needs
	// one is left out of the results, never reported as held.
	Without map[Source]bool
	// Store, when set, lists the manager's store now and StoreBefore is the
	// listing taken before the verb under test (no-leftover-temp-dirs).
	Store       func() ([]string, error)
	StoreBefore *StoreListing

	digests digestCache
}

// ProcScanner is where the checker finds a case's processes: the stack's
// scan, or a manager case's tag scan (TagScan).
type ProcScanner interface {
	ScanProcesses() ([]stack.Proc, error)
	HarnessPIDs() map[int]bool
	Identify(pid int) (stack.Proc, bool)
}

// Source is one black-box data source of a poll.
type Source string

// The sources of a poll.
const (
	SrcAgent   Source = "agent API"
	SrcVMs     Source = "vm list"
	SrcSnaps   Source = "snapshot list"
	SrcCheck   Source = "manager check"
	SrcProcs   Source = "/proc scan"
	SrcLocks   Source = "/proc/locks"
	SrcSockets Source = "api sockets"
)

// AgentView is the part of the agent API's VM view the checker reads.
type AgentView struct {
	Name               string
	Lifecycle          string
	ObservedGeneration int64
	Message            string
	PostClone          string
	VMID               string
	FailedReason       string
	Op, Step           string
}

// Poll is one observation of the whole stack. Errs holds, per source, why it
// could not be read; the fields of an errored source are not to be trusted.
// Read holds the sources that were read: a source in neither was never
// read, and its empty fields are no evidence either.
type Poll struct {
	TsNs int64
	// Quiet: no operation can be in flight at this poll (Input.Quiescent,
	// or Input.InFlight found no verb); QuietWhy says which.
	Quiet    bool
	QuietWhy string
	Errs     map[Source]error
	Read     map[Source]bool
	Views    map[string]AgentView
	VMs      []manager.VM
	Snaps    []manager.Snapshot
	Check    manager.CheckReport
	VMMs     map[string][]stack.Proc // every VMM process, by the VM id it serves
	Vmctls   []stack.Proc            // manager processes (the harness's own left out)
	VMMState map[string]string       // id → state from vm.info (running records only)
	Sockets  map[string]string       // VM id → api socket present
	// StoreDirs: the manager's store dirs now (Input.Store)
	StoreDirs []string
	// OpsHolders and LeaseHolders: who holds the ops lock of a VM and the
	// lease of a pending snapshot, matched by device and inode in /proc/locks.
	OpsHolders   map[string][]manager.Holder
	LeaseHolders map[string][]manager.Holder
	// Pushed: hibernated intent → nil when its snapshot is in the registry
	// and its data matches the manifest's digest, else why not.
	Pushed map[string]error
	// Boot: ready intent → boot id its guest reported, or the error.
	Boot map[string]BootProbe
	// Trees: running VM id → its VMM's device tree (vm.info); Captured:
	// ready snapshot id → the tree its state.json holds.
	Trees    map[string]VMMTree
	Captured map[string]CapturedTree
}

// BootProbe is one boot-id read over SSH.
type BootProbe struct {
	BootID string
	Err    error
}

// errNotRead is the error of a source the poll never read.
var errNotRead = errors.New("never read")

// Err returns the error of the first of srcs that failed or was never read.
func (p *Poll) Err(srcs ...Source) error {
	for _, s := range srcs {
		if err := p.Errs[s]; err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
		if !p.Read[s] {
			return fmt.Errorf("%s: %w", s, errNotRead)
		}
	}
	return nil
}

// got records one read of src: an error fails it, else it was read (a
// source that failed once in a poll stays failed).
func (p *Poll) got(src Source, err error) {
	if err == nil {
		if p.Read == nil {
			p.Read = map[Source]bool{}
		}
		p.Read[src] = true
		return
	}
	p.fail(src, err)
}

func (p *Poll) fail(src Source, err error) {
	if err == nil {
		return
	}
	if p.Errs == nil {
		p.Errs = map[Source]error{}
	}
	if p.Errs[src] == nil {
		p.Errs[src] = err
	}
}

func (in *Input) manager() manager.Observer {
	if in.Manager == nil {
		in.Manager = in.Stack.ManagerObserver()
	}
	return in.Manager
}

// Collect observes the stack: agent API, the manager's list and check verbs,
// processes, VMM states, lock holders, the registry and the guests.
func Collect(ctx context.Context, in *Input, now func() int64) *Poll {
	m, s := in.manager(), in.procs()
	p := &Poll{TsNs: now(), Views: map[string]AgentView{}}
	if !in.Agentless {
		vs, err := in.Stack.Agent.List(ctx)
		p.got(SrcAgent, err)
		if err == nil {
			for _, v := range vs {
				p.Views[v.Name] = AgentView{Name: v.Name, Lifecycle: v.Status.Lifecycle, ObservedGeneration: v.Status.ObservedGeneration,
					Message: v.Status.Message, PostClone: v.Status.PostClone, VMID: v.Status.VMID,
					FailedReason: v.Status.FailedReason, Op: v.Op, Step: v.Step}
			}
		}
	}
	// one read of the three (vmctl observe: one exec a poll) where the
	// manager has it, else its three verbs: the same data and errors
	check := !in.Without[SrcCheck]
	store := manager.ReadStore(ctx, m, check)
	p.VMs, p.Snaps = store.VMs, store.Snaps
	p.got(SrcVMs, store.VMsErr)
	p.got(SrcSnaps, store.SnapsErr)
	if check {
		p.Check = store.Check
		p.got(SrcCheck, store.CheckErr)
	}
	var err error
	p.collectStore(in)

	procs, err := s.ScanProcesses()
	p.got(SrcProcs, err)
	p.quiet(in, procs, err)
	p.VMMs = map[string][]stack.Proc{}
	harness := s.HarnessPIDs()
	for _, pr := range procs {
		if id, ok := m.VMMOf(pr.Argv); ok {
			// a manager in the sandbox's pid namespace records its VMM's
			// pid as seen there
			pr.NSPID = stack.NSLocal(pr.PID)
			p.VMMs[id] = append(p.VMMs[id], pr)
		} else if pr.Name() == "vmctl" && !harness[pr.PID] {
			p.Vmctls = append(p.Vmctls, pr)
		}
	}
	p.collectLocks(s, m, p.Quiet)
	p.VMMState = map[string]string{}
	for _, v := range p.VMs {
		if v.State != manager.StateRunning || len(p.VMMs[v.ID]) == 0 {
			continue
		}
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		info, err := chapi.New(m.APISocket(v.ID)).Info(ictx)
		cancel()
		if err != nil {
			p.VMMState[v.ID] = "unreachable: " + err.Error()
		} else {
			p.VMMState[v.ID] = info.State
			if devTreeAsked(in) {
				p.collectTree(v.ID, info)
			}
		}
	}
	p.collectDevTrees(ctx, in, m)
	p.Sockets, err = m.APISockets()
	p.got(SrcSockets, err)
	if !in.Agentless {
		p.collectGoals(ctx, in)
	}
	return p
}

// quietAt: no operation can be in flight at poll p, and why.
func quietAt(in *Input, p *Poll) (bool, string) {
	if in.Quiescent {
		return true, "every verb of the case has exited"
	}
	return p.Quiet, p.QuietWhy
}

// quiet decides Poll.Quiet: a quiescent case, or (InFlight) a scan read
// whole that finds no verb of the manager running.
func (p *Poll) quiet(in *Input, procs []stack.Proc, scanErr error) {
	switch {
	case in.Quiescent:
		p.Quiet, p.QuietWhy = true, "every verb of the case has exited"
	case in.InFlight != nil && scanErr == nil && len(in.InFlight(procs)) == 0:
		p.Quiet, p.QuietWhy = true, "no verb of the manager is running"
	}
}

// collectLocks reads /proc/locks once and resolves the holders of every VM's
// ops lock and every pending snapshot's lease, naming each holder's process
// when it is one of this case.
func (p *Poll) collectLocks(s ProcScanner, m manager.Observer, quiescent bool) {
	p.OpsHolders, p.LeaseHolders = map[string][]manager.Holder{}, map[string][]manager.Holder{}
	locks, err := ReadLocks()
	p.got(SrcLocks, err)
	if err != nil {
		return
	}
	resolve := func(path string) []manager.Holder {
		hs, err := locks.holders(path)
		if err != nil {
			p.fail(SrcLocks, err)
			return nil
		}
		out := make([]manager.Holder, len(hs))
		copy(out, hs)
		for i := range out {
			if pr, ok := s.Identify(out[i].PID); ok {
				out[i].Argv = pr.Argv
			}
		}
		return out
	}
	// A manager that exposes no lock file (cocoon locks its whole index)
	// gives no holder to read; that is evidence only in a quiescent case,
	// where the checks do not ask who holds a lock (Input.Quiescent).
	lockPath := func(path, what string) bool {
		if path == "" && !quiescent {
			p.fail(SrcLocks, fmt.Errorf("%s exposes no %s and an operation may be in flight: %w", m.Name(), what, manager.ErrNotSupported))
		}
		return path != ""
	}
	for _, v := range p.VMs {
		if path := m.OpsLockPath(v.ID); lockPath(path, "per-VM ops lock") {
			p.OpsHolders[v.ID] = resolve(path)
		}
	}
	for _, sn := range p.Snaps {
		if sn.State != manager.SnapPending {
			continue
		}
		if path := m.LeasePath(sn.ID); lockPath(path, "snapshot lease") {
			p.LeaseHolders[sn.ID] = resolve(path)
		}
	}
}

// StateInvariant is one entry of the polled table.
type StateInvariant struct {
	Name     string
	Why      string
	Needs    []Source                          // sources it reads: one errored or never read → it fails with the error
	Evidence Evidence                          // the positive evidence it needs beyond its sources
	Check    func(in *Input, p *Poll) []string // evidence lines; none = holds
}

// Evidence is what an invariant needs to hold at all (issue #31: nothing
// passes on absent data). Of lists what is missing (none: it has its
// evidence); nil Of means a successful read of its sources is the evidence
// (an absence claim, such as no orphan VMM, is proven by a list read whole).
// Asked, when set, says whether the case asked for the invariant at all: one
// not asked is left out of the results, never reported as held.
type Evidence struct {
	Of    func(in *Input, p *Poll) []string
	Asked func(in *Input) bool
}

// readIsEvidence: the invariant's sources, read whole, are its evidence.
var readIsEvidence = Evidence{}

// needGoals: a goal invariant needs goals to judge. A case that puts no
// intent and only runs VMs of its own (DirectVMs, judged by
// one-vm-per-name) does not ask for it; a case with neither fails it.
var needGoals = Evidence{
	Asked: func(in *Input) bool { return !in.Agentless && (len(in.Goals) > 0 || len(in.DirectVMs) == 0) },
	Of: func(in *Input, _ *Poll) []string {
		if len(in.Goals) == 0 {
			return []string{"no intent goal and no VM of the case's own to judge"}
		}
		return nil
	}}

// needCheckReport: the manager's check must have reported (OK, or its
// violations): an empty report is no check.
var needCheckReport = Evidence{Of: checkReported}

func checkReported(_ *Input, p *Poll) []string {
	if !p.Check.OK && len(p.Check.Violations) == 0 {
		return []string{"the manager's check reported neither OK nor a violation"}
	}
	return nil
}

// needBase: the base snapshot's name, and the check that judges its data.
var needBase = Evidence{Of: func(in *Input, p *Poll) []string {
	if in.BaseName == "" {
		return []string{"no base snapshot named: nothing to keep"}
	}
	return checkReported(in, p)
}}

// needSnapshots: the snapshot list always holds the base snapshot; an empty
// one is no listing.
var needSnapshots = Evidence{Of: func(in *Input, p *Poll) []string {
	if len(p.Snaps) == 0 {
		return []string{"the snapshot list is empty, not even the base snapshot"}
	}
	return nil
}}

// needBaseline: vms-adopted, asked by Expect.Adopted, needs the baseline
// taken before the fault, read and not empty.
var needBaseline = Evidence{
	Asked: func(in *Input) bool { return in.AdoptedIDs != nil || in.AdoptedErr != nil },
	Of: func(in *Input, _ *Poll) []string {
		switch {
		case in.AdoptedErr != nil:
			return []string{fmt.Sprintf("the baseline before the fault could not be read: %v", in.AdoptedErr)}
		case len(in.AdoptedIDs) == 0:
			return []string{"the baseline before the fault is empty: no VM of the case to prove adopted"}
		}
		return nil
	}}

// State is the table of invariants polled until stable.
var State = []StateInvariant{
	{IntentGoal, "every intent reached its goal (hibernated: pushed and readable; ready: the guest answers), nothing failed",
		[]Source{SrcAgent, SrcVMs, SrcProcs}, needGoals, checkIntentGoal},
	{OneVMPerName, "exactly one VM per name", []Source{SrcVMs, SrcProcs}, readIsEvidence, checkOneVMPerName},
	{NoOrphanCreating, "a creating record has a live ops-lock holder of this stack (a free ops lock proves no operation owns it)",
		[]Source{SrcVMs, SrcLocks}, readIsEvidence, func(in *Input, p *Poll) []string {
			var ev []string
			for _, v := range p.VMs {
				if v.State != manager.StateCreating {
					continue
				}
				if e := ownerGone(in, p, p.OpsHolders[v.ID]); e != "" {
					ev = append(ev, fmt.Sprintf("vm %s (%s) is creating and its ops lock %s", v.ID, v.Name, e))
				}
			}
			return ev
		}},
	{NoOrphanVMM, "every VMM process is the only one of its VM, and its VM's record owns it",
		[]Source{SrcVMs, SrcProcs, SrcLocks}, readIsEvidence, checkOrphanVMM},
	{NoRunningWithDeadVMM, "a running record has a live VMM, and where the record names its VMM's pid, that pid is the live one",
		[]Source{SrcVMs, SrcProcs}, readIsEvidence, checkRunningWithDeadVMM},
	{NoPausedRunning, "no VMM Paused while its record says running (an orphaned pause of a dead capture)",
		[]Source{SrcVMs, SrcProcs}, readIsEvidence, func(in *Input, p *Poll) []string {
			var ev []string
			for id, st := range p.VMMState {
				if st != "Running" {
					ev = append(ev, fmt.Sprintf("vm %s: record running, VMM says %s", id, st))
				}
			}
			sort.Strings(ev)
			return ev
		}},
	{NoPendingWithoutLease, "a pending snapshot has a live lease holder of this stack", []Source{SrcSnaps, SrcLocks}, needSnapshots,
		func(in *Input, p *Poll) []string {
			var ev []string
			for _, sn := range p.Snaps {
				if sn.State != manager.SnapPending {
					continue
				}
				if e := ownerGone(in, p, p.LeaseHolders[sn.ID]); e != "" {
					ev = append(ev, fmt.Sprintf("snapshot %s (%s) is pending and its lease %s", sn.ID, sn.Name, e))
				}
			}
			return ev
		}},
	{NoTombstone, "no delete left half-done (read from the manager's check)", []Source{SrcCheck}, needCheckReport, fromCheck(manager.CheckTombstone)},
	{IndexesConsistent, "the store loads and its name indexes and records agree (read from the manager's check)", []Source{SrcCheck}, needCheckReport,
		fromCheck(manager.CheckStoreLoadable, manager.CheckIndexes)},
	{NoVmctlChild, "no vmctl child still running (besides the agent's event watcher and the daemon)", []Source{SrcProcs}, readIsEvidence,
		func(in *Input, p *Poll) []string {
			var ev []string
			for _, pr := range p.Vmctls {
				if isWatcher(pr.Argv) || isDaemon(pr.Argv) {
					continue
				}
				ev = append(ev, pr.String())
			}
			return ev
		}},
	{NoLeftoverSockets, "no api socket without a live VMM", []Source{SrcSockets, SrcProcs}, readIsEvidence, func(in *Input, p *Poll) []string {
		var ev []string
		for id, sock := range p.Sockets {
			if !alive(p, id) {
				ev = append(ev, sock)
			}
		}
		sort.Strings(ev)
		return ev
	}},
	{NoLeftoverStaging, "no staging dir of a dead snapshot build (read from the manager's check)", []Source{SrcCheck}, needCheckReport,
		fromCheck(manager.CheckLeftoverStaging)},
	{NoUnreferencedDirs, "no VM, run or snapshot dir without a record (read from the manager's check)", []Source{SrcCheck}, needCheckReport,
		fromCheck(manager.CheckUnreferencedDirs)},
	{BaseSnapshotKept, "snapshots no intent owns are never touched", []Source{SrcSnaps, SrcCheck}, needBase, func(in *Input, p *Poll) []string {
		if in.BaseName == "" {
			return nil
		}
		for _, sn := range p.Snaps {
			if sn.Name == in.BaseName && sn.State == manager.SnapReady {
				var ev []string
				for _, e := range p.Check.Of(manager.CheckSnapshotData) {
					if strings.Contains(e, sn.ID) {
						ev = append(ev, fmt.Sprintf("snapshot %q: %s", in.BaseName, e))
					}
				}
				return ev
			}
		}
		return []string{fmt.Sprintf("snapshot %q is gone", in.BaseName)}
	}},
	{VMsAdopted, "VMs that existed before the fault are adopted, not recreated", []Source{SrcVMs}, needBaseline, func(in *Input, p *Poll) []string {
		var ev []string
		for name, id := range in.AdoptedIDs {
			found := false
			for _, v := range p.VMs {
				if v.Name == name {
					found = true
					if v.ID != id {
						ev = append(ev, fmt.Sprintf("%s was %s before the fault, now %s", name, id, v.ID))
					}
				}
			}
			if !found {
				ev = append(ev, fmt.Sprintf("%s (%s) is gone", name, id))
			}
		}
		sort.Strings(ev)
		return ev
	}},
	devTreeInvariant,
}

// fromCheck turns the manager's own check report into evidence for the
// named violations.
func fromCheck(invariants ...string) func(*Input, *Poll) []string {
	return func(_ *Input, p *Poll) []string {
		var ev []string
		for _, inv := range invariants {
			ev = append(ev, p.Check.Of(inv)...)
		}
		return ev
	}
}

// ownerGone is heldByCase, except at a quiet poll, where nothing can own a
// creating record or a pending snapshot any more.
func ownerGone(in *Input, p *Poll, hs []manager.Holder) string {
	if q, why := quietAt(in, p); q {
		return "has no owner: " + why
	}
	return heldByCase(hs)
}

// heldByCase returns "" when some process of this stack holds the lock, else
// what is wrong: free, or held only by processes the case does not own.
func heldByCase(hs []manager.Holder) string {
	if len(hs) == 0 {
		return "is free"
	}
	for _, h := range hs {
		if len(h.Argv) > 0 {
			return ""
		}
	}
	return "is held only by " + describeHolders(hs)
}

func checkOrphanVMM(in *Input, p *Poll) []string {
	quiet, why := quietAt(in, p)
	recs := map[string]manager.VM{}
	for _, v := range p.VMs {
		recs[v.ID] = v
	}
	ids := make([]string, 0, len(p.VMMs))
	for id := range p.VMMs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var ev []string
	for _, id := range ids {
		vmms := p.VMMs[id]
		if len(vmms) == 0 {
			continue
		}
		if len(vmms) > 1 {
			ev = append(ev, fmt.Sprintf("vm %s has %d VMM processes: %s", id, len(vmms), procList(vmms)))
		}
		v, ok := recs[id]
		switch {
		case !ok:
			ev = append(ev, fmt.Sprintf("VMM %s for vm %s has no record", vmms[0], id))
		case v.State == manager.StateRunning && v.PID > 0 && len(vmms) == 1 && !vmms[0].Is(v.PID):
			// the record names another (dead) VMM: nothing will ever stop
			// or reach this one through the record
			ev = append(ev, fmt.Sprintf("VMM %s runs under vm %s (%s) whose record names VMM pid %d", vmms[0], id, v.Name, v.PID))
		case quiet && v.State != manager.StateRunning:
			// no verb is left: nothing will ever stop it
			ev = append(ev, fmt.Sprintf("VMM %s runs under vm %s (%s) whose record is %q and %s", vmms[0], id, v.Name, v.State, why))
		case v.State != manager.StateRunning && v.State != manager.StateCreating && heldByCase(p.OpsHolders[id]) != "":
			// a VMM under a stopped/created/error record with no
			// operation in flight is one nobody will ever stop
			ev = append(ev, fmt.Sprintf("VMM %s runs under vm %s (%s) whose record is %q and no operation holds its ops lock", vmms[0], id, v.Name, v.State))
		}
	}
	return ev
}

func alive(p *Poll, id string) bool { return len(p.VMMs[id]) > 0 }

// checkRunningWithDeadVMM: a running (or stale) record whose VM has no live
// VMM, or whose recorded VMM pid is dead while another VMM of the VM lives.
// The second is what a verb killed between starting its VMM and recording
// its pid leaves when the next start launches a VMM beside the orphan (cocoon
// writes ch.pid after exec, hypervisor/cloudhypervisor/start.go
// launchProcess): any live VMM would otherwise vouch for a dead record.
func checkRunningWithDeadVMM(in *Input, p *Poll) []string {
	var ev []string
	for _, v := range p.VMs {
		switch {
		case v.State == manager.StateStale || (v.State == manager.StateRunning && !alive(p, v.ID)):
			ev = append(ev, fmt.Sprintf("vm %s (%s) reads %q and its VMM is dead", v.ID, v.Name, v.State))
		case v.State == manager.StateRunning && v.PID > 0 && !slices.ContainsFunc(p.VMMs[v.ID], func(pr stack.Proc) bool { return pr.Is(v.PID) }):
			ev = append(ev, fmt.Sprintf("vm %s (%s) reads running under VMM pid %d, which is dead; the VM's live VMM is another: %s", v.ID, v.Name, v.PID, procList(p.VMMs[v.ID])))
		}
	}
	return ev
}

func procList(ps []stack.Proc) string {
	w := make([]string, 0, len(ps))
	for _, pr := range ps {
		w = append(w, pr.String())
	}
	return strings.Join(w, "; ")
}

func isWatcher(argv []string) bool {
	return len(argv) > 2 && argv[1] == "vm" && argv[2] == "status"
}

func isDaemon(argv []string) bool { return len(argv) > 1 && argv[1] == "daemon" }

func checkIntentGoal(in *Input, p *Poll) []string {
	byName := map[string][]manager.VM{}
	for _, v := range p.VMs {
		byName[v.Name] = append(byName[v.Name], v)
	}
	var ev []string
	names := make([]string, 0, len(in.Goals))
	for n := range in.Goals {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		goal := in.Goals[name]
		view, known := p.Views[name]
		vms := byName[name]
		switch goal {
		case GoalDeleted:
			if known {
				ev = append(ev, fmt.Sprintf("%s: want deleted, agent still has it (%s)", name, describe(view)))
			}
			if len(vms) > 0 {
				ev = append(ev, fmt.Sprintf("%s: want deleted, vm %s still exists (%s)", name, vms[0].ID, vms[0].State))
			}
			continue
		}
		if !known {
			ev = append(ev, fmt.Sprintf("%s: want %s, the agent does not know it", name, goal))
			continue
		}
		if view.Lifecycle != goal {
			ev = append(ev, fmt.Sprintf("%s: want %s, is %s", name, goal, describe(view)))
			continue
		}
		if g := in.Generation[name]; g > 0 && view.ObservedGeneration < g {
			ev = append(ev, fmt.Sprintf("%s: %s but observed generation %d < %d", name, goal, view.ObservedGeneration, g))
		}
		switch goal {
		case GoalReady:
			ev = append(ev, readyEvidence(p, name, view, vms)...)
		case GoalHibernated:
			// never report hibernated while an unsaved VM is alive
			for _, v := range vms {
				ev = append(ev, fmt.Sprintf("%s: hibernated but vm %s still exists (%s)", name, v.ID, v.State))
			}
			if err, probed := p.Pushed[name]; !probed {
				ev = append(ev, fmt.Sprintf("%s: hibernated but the registry was not read", name))
			} else if err != nil {
				ev = append(ev, fmt.Sprintf("%s: hibernated but its snapshot is not in the registry: %v", name, err))
			}
		}
	}
	return ev
}

// readyEvidence: ready means one running VM with a live VMM, post_clone done
// and a guest that answers over SSH.
func readyEvidence(p *Poll, name string, view AgentView, vms []manager.VM) []string {
	if len(vms) != 1 {
		return []string{fmt.Sprintf("%s: ready but %d vm records", name, len(vms))}
	}
	var ev []string
	v := vms[0]
	if v.State != manager.StateRunning || !alive(p, v.ID) {
		ev = append(ev, fmt.Sprintf("%s: ready but vm %s is %q (VMM alive %v)", name, v.ID, v.State, alive(p, v.ID)))
	}
	if view.VMID != "" && view.VMID != v.ID {
		ev = append(ev, fmt.Sprintf("%s: agent says vm %s, the store has %s", name, view.VMID, v.ID))
	}
	if view.PostClone != "done" {
		ev = append(ev, fmt.Sprintf("%s: ready but post_clone is %q, not done", name, view.PostClone))
	}
	switch b, probed := p.Boot[name]; {
	case !probed:
		ev = append(ev, fmt.Sprintf("%s: ready but its guest was not asked (no SSH probe)", name))
	case b.Err != nil:
		ev = append(ev, fmt.Sprintf("%s: ready but its guest does not answer over SSH: %v", name, b.Err))
	case b.BootID == "":
		ev = append(ev, fmt.Sprintf("%s: ready but its guest reported an empty boot id", name))
	}
	return ev
}

func describe(v AgentView) string {
	s := v.Lifecycle
	if s == "" {
		s = "(no lifecycle)"
	}
	if v.Message != "" {
		s += ": " + v.Message
	}
	if v.FailedReason != "" {
		s += " [failed: " + v.FailedReason + "]"
	}
	if v.Op != "" {
		s += fmt.Sprintf(" (op %s step %s)", v.Op, v.Step)
	}
	return s
}

func checkOneVMPerName(in *Input, p *Poll) []string {
	count := map[string][]string{}
	for _, v := range p.VMs {
		count[v.Name] = append(count[v.Name], v.ID+"("+v.State+")")
	}
	var ev []string
	for name, ids := range count {
		if len(ids) > 1 {
			ev = append(ev, fmt.Sprintf("%s: %d vms %v", name, len(ids), ids))
		}
	}
	for _, name := range in.DirectVMs {
		ids := count[name]
		if len(ids) != 1 {
			ev = append(ev, fmt.Sprintf("%s: want exactly one running vm, have %d %v", name, len(ids), ids))
			continue
		}
		for _, v := range p.VMs {
			if v.Name == name && (v.State != manager.StateRunning || !alive(p, v.ID)) {
				ev = append(ev, fmt.Sprintf("%s: vm %s is %q", name, v.ID, v.State))
			}
		}
	}
	sort.Strings(ev)
	return ev
}

// Evaluate runs the state table over one poll. An invariant whose data
// source errored or was never read fails with that error, and one without
// the evidence it declares fails saying what is missing: missing data is
// never a pass. An invariant the case did not ask for is left out.
func Evaluate(in *Input, p *Poll) []reports.Invariant {
	out := make([]reports.Invariant, 0, len(State))
	for _, inv := range State {
		if inv.Evidence.Asked != nil && !inv.Evidence.Asked(in) || in.without(inv.Needs) {
			continue
		}
		out = append(out, result(inv.Name, inv.judge(in, p)))
	}
	return out
}

// judge is one invariant over one poll: its sources, its evidence, then
// its check.
func (inv StateInvariant) judge(in *Input, p *Poll) []string {
	if err := p.Err(inv.Needs...); err != nil {
		return []string{"data source failed, nothing proven: " + err.Error()}
	}
	if inv.Evidence.Of != nil {
		if missing := inv.Evidence.Of(in, p); len(missing) > 0 {
			return append([]string{"no evidence, nothing proven"}, missing...)
		}
	}
	return inv.Check(in, p)
}

func result(name string, ev []string) reports.Invariant {
	r := reports.Invariant{Name: name, OK: len(ev) == 0}
	if len(ev) > 0 {
		if len(ev) > 8 {
			ev = append(ev[:8], fmt.Sprintf("… and %d more", len(ev)-8))
		}
		r.Evidence = strings.Join(ev, "; ")
	}
	return r
}

// AllOK reports whether every invariant holds.
func AllOK(invs []reports.Invariant) bool {
	for _, i := range invs {
		if !i.OK {
			return false
		}
	}
	return true
}

// digestCache remembers verified registry files by path, size and mtime, so
// a poll does not hash an unchanged snapshot again.
type digestCache struct {
	mu sync.Mutex
	ok map[string]string // path → "size/mtime/sha256" verified
}

var errNoProbe = errors.New("no SSH probe configured")
