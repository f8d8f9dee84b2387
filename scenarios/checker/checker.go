// Package checker is the convergence checker (ARCHITECTURE §9): after a
// fault, the stack must reach a state where every invariant below holds for
// several consecutive polls, by itself. Every invariant is a named entry in a
// table and reports evidence when it fails; the names are the ones the
// regress table (regress.Bugs[].Invariant) refers to.
package checker

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/nodeagent"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios/stack"
	"github.com/vmchaos/vmchaos/vmctl"
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
	Goals      map[string]string // intent name → ready|hibernated|deleted
	Generation map[string]int64  // intent name → generation the harness last set (0: unknown)
	DirectVMs  []string          // harness-created VMs that must exist once and run
	AdoptedIDs map[string]string // name → VM id before the fault (Expect.Adopted)
	BaseName   string            // snapshot every intent clones from: never removed
}

// Poll is one observation of the whole stack.
type Poll struct {
	TsNs     int64
	Views    map[string]nodeagent.VMView
	ViewsErr error
	VMs      []vmctl.VM
	VMsErr   error
	Snaps    []vmctl.Snapshot
	SnapsErr error
	VMIndex  rawIndex
	SnapIx   rawIndex
	IndexErr error
	VMMs     map[string]stack.Proc
	Vmctls   []stack.Proc
	VMMState map[string]string // id → state from vm.info (running records only)
	Held     map[uint64]bool   // inodes with a flock/OFD lock held
	Sockets  []string          // api sockets present under the run dir
}

type rawIndex struct {
	Records    map[string]json.RawMessage `json:"-"`
	Names      map[string]string          `json:"names"`
	Tombstones map[string]json.RawMessage `json:"tombstones"`
	recNames   map[string]string          // id → name of the record
}

// Collect observes the stack: agent API, vmctl list, raw indexes (for
// tombstones and name maps only), processes, VMM states, held locks.
func Collect(ctx context.Context, in *Input, now func() int64) *Poll {
	s := in.Stack
	p := &Poll{TsNs: now(), Views: map[string]nodeagent.VMView{}}
	if vs, err := s.Agent.List(ctx); err != nil {
		p.ViewsErr = err
	} else {
		for _, v := range vs {
			p.Views[v.Name] = v
		}
	}
	p.VMs, p.VMsErr = s.ListVMs(ctx)
	p.Snaps, p.SnapsErr = s.ListSnapshots(ctx)
	p.VMIndex, p.IndexErr = readIndex(filepath.Join(s.Root, "vms.json"), "vms")
	if p.IndexErr == nil {
		p.SnapIx, p.IndexErr = readIndex(filepath.Join(s.Root, "snapshots.json"), "snapshots")
	}
	p.VMMs = s.VMMs()
	p.Vmctls = s.VmctlProcs()
	p.Held = heldInodes()
	p.VMMState = map[string]string{}
	for _, v := range p.VMs {
		if v.State != vmctl.StateRunning {
			continue
		}
		if _, alive := p.VMMs[v.ID]; !alive {
			continue
		}
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		info, err := chapi.New(filepath.Join(s.RunDir, v.ID, "api.sock")).Info(ictx)
		cancel()
		if err != nil {
			p.VMMState[v.ID] = "unreachable: " + err.Error()
		} else {
			p.VMMState[v.ID] = info.State
		}
	}
	socks, _ := filepath.Glob(filepath.Join(s.RunDir, "*", "api.sock"))
	p.Sockets = socks
	return p
}

func readIndex(path, recKey string) (rawIndex, error) {
	ix := rawIndex{recNames: map[string]string{}}
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return ix, nil
	}
	if err != nil {
		return ix, err
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(b, &doc); err != nil {
		return ix, fmt.Errorf("%s: %w", path, err)
	}
	_ = json.Unmarshal(doc["names"], &ix.Names)
	_ = json.Unmarshal(doc["tombstones"], &ix.Tombstones)
	_ = json.Unmarshal(doc[recKey], &ix.Records)
	for id, r := range ix.Records {
		var rec struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(r, &rec)
		ix.recNames[id] = rec.Name
	}
	return ix, nil
}

// heldInodes parses /proc/locks: the set of inodes some process holds a
// FLOCK/POSIX/OFD lock on. The checker never takes a lock itself (that would
// change what it observes).
func heldInodes() map[uint64]bool {
	out := map[uint64]bool{}
	f, err := os.Open("/proc/locks")
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		// "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; blocked
		// waiters carry "->" and hold nothing.
		if len(fs) < 6 || fs[1] == "->" {
			continue
		}
		dev := fs[5]
		parts := strings.Split(dev, ":")
		if len(parts) != 3 {
			continue
		}
		ino, err := strconv.ParseUint(parts[2], 10, 64)
		if err == nil {
			out[ino] = true
		}
	}
	return out
}

func (p *Poll) held(path string) bool {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return false
	}
	return p.Held[st.Ino]
}

// StateInvariant is one entry of the polled table.
type StateInvariant struct {
	Name  string
	Why   string
	Check func(in *Input, p *Poll) []string // evidence lines; none = holds
}

// State is the table of invariants polled until stable.
var State = []StateInvariant{
	{IntentGoal, "every intent reached its goal, nothing failed", checkIntentGoal},
	{OneVMPerName, "exactly one VM per name", checkOneVMPerName},
	{NoOrphanCreating, "a creating record must have a live ops-lock holder (a free ops lock proves no operation owns it)", func(in *Input, p *Poll) []string {
		var ev []string
		for _, v := range p.VMs {
			if v.State == vmctl.StateCreating && !p.held(filepath.Join(in.Stack.Root, "locks", "vm", v.ID+".lock")) {
				ev = append(ev, fmt.Sprintf("vm %s (%s) is creating and its ops lock is free", v.ID, v.Name))
			}
		}
		return ev
	}},
	{NoOrphanVMM, "every VMM process is referenced by a record", func(in *Input, p *Poll) []string {
		ids := map[string]bool{}
		for _, v := range p.VMs {
			ids[v.ID] = true
		}
		var ev []string
		for id, pr := range p.VMMs {
			if !ids[id] {
				ev = append(ev, fmt.Sprintf("VMM %s for vm %s has no record", pr, id))
			}
		}
		return ev
	}},
	{NoRunningWithDeadVMM, "a running record has a live VMM", func(in *Input, p *Poll) []string {
		var ev []string
		for _, v := range p.VMs {
			if v.State == vmctl.StateStale || (v.State == vmctl.StateRunning && !alive(p, v.ID)) {
				ev = append(ev, fmt.Sprintf("vm %s (%s) reads %q and its VMM is dead", v.ID, v.Name, v.State))
			}
		}
		return ev
	}},
	{NoPausedRunning, "no VMM Paused while its record says running (an orphaned pause of a dead capture)", func(in *Input, p *Poll) []string {
		var ev []string
		for id, st := range p.VMMState {
			if st != "Running" {
				ev = append(ev, fmt.Sprintf("vm %s: record running, VMM says %s", id, st))
			}
		}
		return ev
	}},
	{NoPendingWithoutLease, "a pending snapshot has a live lease holder", func(in *Input, p *Poll) []string {
		var ev []string
		for _, sn := range p.Snaps {
			if sn.State == vmctl.SnapPending && !p.held(filepath.Join(in.Stack.Root, "snapshots", sn.ID+".lease")) {
				ev = append(ev, fmt.Sprintf("snapshot %s (%s) pending and its lease is free", sn.ID, sn.Name))
			}
		}
		return ev
	}},
	{NoTombstone, "no delete left half-done", func(in *Input, p *Poll) []string {
		var ev []string
		for id := range p.VMIndex.Tombstones {
			ev = append(ev, "vm tombstone "+id)
		}
		for id := range p.SnapIx.Tombstones {
			ev = append(ev, "snapshot tombstone "+id)
		}
		sort.Strings(ev)
		return ev
	}},
	{IndexesConsistent, "name indexes and records agree", func(in *Input, p *Poll) []string {
		if p.IndexErr != nil {
			return []string{"index unreadable: " + p.IndexErr.Error()}
		}
		var ev []string
		for _, ix := range []struct {
			what string
			ix   rawIndex
		}{{"vm", p.VMIndex}, {"snapshot", p.SnapIx}} {
			for name, id := range ix.ix.Names {
				if rn, ok := ix.ix.recNames[id]; !ok || rn != name {
					ev = append(ev, fmt.Sprintf("%s name %q → %s, record name %q (present %v)", ix.what, name, id, rn, ok))
				}
			}
			for id, name := range ix.ix.recNames {
				if ix.ix.Names[name] != id {
					ev = append(ev, fmt.Sprintf("%s record %s (%q) not in the name index", ix.what, id, name))
				}
			}
		}
		sort.Strings(ev)
		return ev
	}},
	{NoVmctlChild, "no vmctl child still running (besides the agent's event watcher)", func(in *Input, p *Poll) []string {
		var ev []string
		for _, pr := range p.Vmctls {
			if isWatcher(pr.Argv) || isDaemon(pr.Argv) {
				continue
			}
			ev = append(ev, pr.String())
		}
		return ev
	}},
	{NoLeftoverSockets, "no api socket without a live VMM", func(in *Input, p *Poll) []string {
		var ev []string
		for _, sock := range p.Sockets {
			id := filepath.Base(filepath.Dir(sock))
			if !alive(p, id) {
				ev = append(ev, sock)
			}
		}
		return ev
	}},
	{BaseSnapshotKept, "snapshots no intent owns are never touched", func(in *Input, p *Poll) []string {
		if in.BaseName == "" || p.SnapsErr != nil {
			return nil
		}
		for _, sn := range p.Snaps {
			if sn.Name == in.BaseName && sn.State == vmctl.SnapReady {
				return nil
			}
		}
		return []string{fmt.Sprintf("snapshot %q is gone", in.BaseName)}
	}},
	{VMsAdopted, "VMs that existed before the fault are adopted, not recreated", func(in *Input, p *Poll) []string {
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
}

func alive(p *Poll, id string) bool { _, ok := p.VMMs[id]; return ok }

func isWatcher(argv []string) bool {
	return len(argv) > 2 && argv[1] == "vm" && argv[2] == "status"
}

func isDaemon(argv []string) bool { return len(argv) > 1 && argv[1] == "daemon" }

func checkIntentGoal(in *Input, p *Poll) []string {
	if p.ViewsErr != nil {
		return []string{"agent API: " + p.ViewsErr.Error()}
	}
	if p.VMsErr != nil {
		return []string{"vm list: " + p.VMsErr.Error()}
	}
	byName := map[string][]vmctl.VM{}
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
		if view.Status.Lifecycle != goal {
			ev = append(ev, fmt.Sprintf("%s: want %s, is %s", name, goal, describe(view)))
			continue
		}
		if g := in.Generation[name]; g > 0 && view.Status.ObservedGeneration < g {
			ev = append(ev, fmt.Sprintf("%s: %s but observed generation %d < %d", name, goal, view.Status.ObservedGeneration, g))
		}
		switch goal {
		case GoalReady:
			if len(vms) != 1 {
				ev = append(ev, fmt.Sprintf("%s: ready but %d vm records", name, len(vms)))
				continue
			}
			v := vms[0]
			if v.State != vmctl.StateRunning || !alive(p, v.ID) {
				ev = append(ev, fmt.Sprintf("%s: ready but vm %s is %q (VMM alive %v)", name, v.ID, v.State, alive(p, v.ID)))
			}
			if view.Status.VMID != "" && view.Status.VMID != v.ID {
				ev = append(ev, fmt.Sprintf("%s: agent says vm %s, the store has %s", name, view.Status.VMID, v.ID))
			}
		case GoalHibernated:
			// never report hibernated while an unsaved VM is alive
			for _, v := range vms {
				ev = append(ev, fmt.Sprintf("%s: hibernated but vm %s still exists (%s)", name, v.ID, v.State))
			}
		}
	}
	return ev
}

func describe(v nodeagent.VMView) string {
	s := v.Status.Lifecycle
	if s == "" {
		s = "(no lifecycle)"
	}
	if v.Status.Message != "" {
		s += ": " + v.Status.Message
	}
	if v.Status.FailedReason != "" {
		s += " [failed: " + v.Status.FailedReason + "]"
	}
	if v.Op != "" {
		s += fmt.Sprintf(" (op %s step %s)", v.Op, v.Step)
	}
	return s
}

func checkOneVMPerName(in *Input, p *Poll) []string {
	if p.VMsErr != nil {
		return []string{"vm list: " + p.VMsErr.Error()}
	}
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
			if v.Name == name && (v.State != vmctl.StateRunning || !alive(p, v.ID)) {
				ev = append(ev, fmt.Sprintf("%s: vm %s is %q", name, v.ID, v.State))
			}
		}
	}
	sort.Strings(ev)
	return ev
}

// Evaluate runs the state table over one poll.
func Evaluate(in *Input, p *Poll) []reports.Invariant {
	out := make([]reports.Invariant, 0, len(State))
	for _, inv := range State {
		ev := inv.Check(in, p)
		r := reports.Invariant{Name: inv.Name, OK: len(ev) == 0}
		if len(ev) > 0 {
			if len(ev) > 8 {
				ev = append(ev[:8], fmt.Sprintf("… and %d more", len(ev)-8))
			}
			r.Evidence = strings.Join(ev, "; ")
		}
		out = append(out, r)
	}
	return out
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
