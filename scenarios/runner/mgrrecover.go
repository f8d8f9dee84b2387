package runner

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/checker"
)

// Refusals of a retry the way the field recovers them (seed 001 #3: "snapshot
// name … already in use by <ID>"): the holder is removed by its id, never
// by a fresh name; a held lease or lock is waited for; a delete whose
// object is gone is done.
var (
	// cocoon and the field: "already in use by <ID>"; vmctl: "already
	// exists (id: <ID>)"
	refusedByHolder = regexp.MustCompile(`already (?:in use by |exists \(id: ?)([A-Za-z0-9][A-Za-z0-9_.-]*)`)
	refusedByLease  = regexp.MustCompile(`(?i)\blease\b|lock held|\blocked\b|\bbusy\b`)
	refusedNotFound = regexp.MustCompile(`(?i)not found|no such`)
)

// leaseWaits bounds how often a retry refused by a held lease is repeated.
const leaseWaits = 10

// recover runs the op's recovery calls; the last one is the retry under
// the dead verb's own names, and it must succeed. Every step's outcome is
// the evidence.
func (mc *mgrCase) recover(ctx context.Context) reports.Invariant {
	var steps []string
	calls := mc.mc.Op.Recovery
	inv := reports.Invariant{Name: RecoveryVerbSucceeds}
	for i, call := range calls {
		if !manager.Supported(mc.m, call.Verb) {
			steps = append(steps, fmt.Sprintf("%s: the manager has no such verb", call.Verb))
			continue
		}
		res := mc.verb(ctx, call)
		steps = append(steps, res.String())
		if i == len(calls)-1 {
			var more []string
			res, more = mc.retryRefused(ctx, call, res)
			steps = append(steps, more...)
			inv.OK = res.err == nil
		}
	}
	inv.Evidence = strings.Join(steps, "; ")
	return inv
}

// retryRefused recovers a refused retry as an embedder does and retries
// under the same names; it returns the last result and the steps it took.
func (mc *mgrCase) retryRefused(ctx context.Context, call manager.Call, res verbResult) (verbResult, []string) {
	var steps []string
	for wait := 0; res.err != nil && wait < leaseWaits && ctx.Err() == nil; {
		said := res.tail
		switch m := refusedByHolder.FindStringSubmatch(said); {
		case m != nil:
			if (call.Verb == manager.VerbClone || call.Verb == manager.VerbCreate) && mc.before != nil && !mc.before.Records[m[1]] {
				mc.nameHeld = append(mc.nameHeld, fmt.Sprintf("after the manager's own recovery the dead %s's record %s still held the name %q (retry refused: %s)",
					call.Verb, m[1], call.Name, oneLineTail(said)))
			}
			rm := mc.holderRm(call, m[1])
			if rm.Verb == "" {
				return res, steps
			}
			r := mc.verb(ctx, rm)
			steps = append(steps, "refused by holder "+m[1]+", so "+r.String())
			if r.err != nil {
				return res, steps
			}
		case refusedByLease.MatchString(said):
			wait++
			time.Sleep(mc.settle())
			steps = append(steps, fmt.Sprintf("refused by a held lease, waited %s", mc.settle()))
		case refusedNotFound.MatchString(said) && (call.Verb == manager.VerbRm || call.Verb == manager.VerbSnapshotRm):
			return mc.deleteDone(ctx, call, res, steps)
		default:
			return res, steps
		}
		res = mc.verb(ctx, call)
		steps = append(steps, "retry: "+res.String())
	}
	return res, steps
}

// holderRm is the delete of the object holding call's name, by its id.
func (mc *mgrCase) holderRm(call manager.Call, id string) manager.Call {
	switch call.Verb {
	case manager.VerbSnapshotSave:
		return manager.Call{Verb: manager.VerbSnapshotRm, Snapshot: id}
	case manager.VerbClone, manager.VerbCreate:
		return manager.Call{Verb: manager.VerbRm, VM: id}
	}
	return manager.Call{}
}

// deleteDone: a retried delete that says its object is not found succeeded
// when the list agrees the object is gone (the dead verb finished it).
func (mc *mgrCase) deleteDone(ctx context.Context, call manager.Call, res verbResult, steps []string) (verbResult, []string) {
	vms, err := mc.m.VMs(ctx)
	if err != nil {
		return res, append(steps, "vm list: "+err.Error())
	}
	for _, v := range vms {
		if call.Verb == manager.VerbRm && (v.Name == call.VM || v.ID == call.VM) {
			return res, append(steps, fmt.Sprintf("said not found but the list still has %s %s (%s)", v.ID, v.Name, v.State))
		}
	}
	if call.Verb == manager.VerbSnapshotRm {
		snaps, err := mc.m.Snapshots(ctx)
		if err != nil {
			return res, append(steps, "snapshot list: "+err.Error())
		}
		for _, s := range snaps {
			if s.Name == call.Snapshot || s.ID == call.Snapshot {
				return res, append(steps, fmt.Sprintf("said not found but the list still has snapshot %s %s", s.ID, s.Name))
			}
		}
	}
	res.err = nil
	return res, append(steps, "not found and gone from the list: the dead verb had finished the delete")
}

// streamWait bounds how long the event stream may lag the list (cocoon
// polls every whole second besides its fsnotify wake-ups).
const streamWait = 5 * time.Second

// streamMatches: the event stream ends where the store ends. For every VM
// the list shows, the stream's last event carries the state the list
// implies (a running record whose VMM is dead reads "stopped (stale)"); a
// VM the stream still shows is in the list; the stream is still up. A
// stream that died, or a line its adapter cannot read, is the manager's
// failure too.
func (mc *mgrCase) streamMatches(ctx context.Context) reports.Invariant {
	inv := reports.Invariant{Name: EventsMatchState}
	deadline := time.Now().Add(streamWait)
	for {
		bad, err := mc.streamDiff(ctx)
		switch {
		case err != nil:
			inv.Evidence = "data source failed, nothing proven: " + err.Error()
		case len(bad) == 0:
			inv.OK, inv.Evidence = true, ""
			return inv
		default:
			inv.Evidence = strings.Join(bad, "; ")
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return inv
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (mc *mgrCase) streamDiff(ctx context.Context) ([]string, error) {
	vms, err := mc.m.VMs(ctx)
	if err != nil {
		return nil, err
	}
	procs, err := mc.input().Procs.ScanProcesses()
	if err != nil {
		return nil, err
	}
	live := map[int]string{}
	for _, p := range procs {
		if id, ok := mc.m.VMMOf(p.Argv); ok {
			live[p.PID] = id
		}
	}
	var evs []manager.Event
	for _, e := range mc.events.since(0) {
		evs = append(evs, e.ev)
	}
	bad := diffStream(vms, live, evs)
	if code, gone := mc.events.exited(); gone {
		bad = append(bad, fmt.Sprintf("the event stream exited %d during the case", code))
	}
	if u := mc.events.unparsable(); len(u) > 0 {
		bad = append(bad, fmt.Sprintf("%d line(s) of the event stream unreadable, first: %s", len(u), u[0]))
	}
	return bad, nil
}

// diffStream compares the stream's last event per VM with the listed store
// and the live VMMs (pid → VM id).
func diffStream(vms []manager.VM, live map[int]string, evs []manager.Event) []string {
	last := map[string]manager.Event{}
	for _, e := range evs {
		last[e.ID] = e
	}
	var bad []string
	listed := map[string]bool{}
	for _, v := range vms {
		listed[v.ID] = true
		want := v.State
		if want == manager.StateRunning && live[v.PID] != v.ID {
			want = manager.StateStale
		}
		e, ok := last[v.ID]
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("%s %q (%s) never appeared on the event stream", v.ID, v.Name, want))
		case e.Type == "DELETED" || e.State != want:
			bad = append(bad, fmt.Sprintf("%s %q is %s, the stream's last event says %s %q", v.ID, v.Name, want, e.Type, e.State))
		}
	}
	for id, e := range last {
		if !listed[id] && e.Type != "DELETED" {
			bad = append(bad, fmt.Sprintf("%s %q is gone, the stream's last event says %s %q", id, e.Name, e.Type, e.State))
		}
	}
	sort.Strings(bad)
	return bad
}

// discover runs op once, unarmed, on a scratch store of its own and
// returns the VMM phases (fakech's ch.* points) the verb passed through, in
// the order of their first hit: the park cases are every phase this
// manager's verb really reaches (vmctl's `rm --force` kills its VMM without
// a shutdown request, cocoon's asks for one).
func (r *Runner) discover(ctx context.Context, op scenarios.MgrOp) ([]string, error) {
	dir := r.nextMgrDir("d")
	c := scenarios.Case{ID: "discover-" + string(op.Verb), Scenario: &scenarios.Scenario{ID: "discover-" + string(op.Verb),
		Mgr: &scenarios.MgrCase{Manager: r.mgr.name, Op: op}}}
	rc := reports.Case{}
	mc := &mgrCase{r: r, c: c, mc: c.Scenario.Mgr, rc: &rc, dir: dir, caseDir: dir + "-logs"}
	mc.tag = EnvCaseTag + "=" + dir
	phases, err := mc.discoverOne(ctx)
	if terr := mc.teardown(); err == nil && terr != nil {
		err = terr
	}
	if err != nil {
		return nil, fmt.Errorf("%w (logs: %s)", err, mc.caseDir)
	}
	_ = os.RemoveAll(mc.caseDir)
	return phases, nil
}

func (mc *mgrCase) discoverOne(ctx context.Context) ([]string, error) {
	if err := mc.prepare(ctx); err != nil {
		return nil, err
	}
	if err := mc.baseline(ctx); err != nil {
		return nil, err
	}
	mark := mc.trace.Mark()
	if res := mc.verb(ctx, mc.mc.Op.Call); res.err != nil {
		return nil, fmt.Errorf("unarmed run failed: %s", res)
	}
	// The VMM's datagrams are sent before its reply; let the trace reader
	// take the last ones in.
	if err := mc.trace.Drain(ctx); err != nil {
		return nil, err
	}
	var phases []string
	seen := map[string]bool{}
	for _, e := range mc.trace.Since(mark) {
		if strings.HasPrefix(e.Point, "ch.") && !seen[e.Point] {
			seen[e.Point] = true
			phases = append(phases, e.Point)
		}
	}
	// The recovery's gc makes the manager's own dirs on first use too
	// (cocoon's gc, rm and start make root/cni: cmd/others/handler.go and
	// cmd/vm/handler.go call cmdcore.InitNetwork): run it unarmed once, so
	// the layout learnt below holds them.
	if manager.Supported(mc.m, manager.VerbGC) {
		if res := mc.verb(ctx, manager.Call{Verb: manager.VerbGC}); res.err != nil {
			return nil, fmt.Errorf("unarmed gc after the unarmed run failed: %s", res)
		}
	}
	if err := mc.learnLayout(ctx); err != nil {
		return nil, err
	}
	return phases, nil
}

// learnLayout records the dirs a successful unarmed run of the verb (and of
// gc after it) made in the store that no record explains: the manager's own layout, made on first
// use (cocoon's root/cni), which no-leftover-temp-dirs must not count as a
// leftover of the killed verb. Only a run that succeeded teaches it, so a
// dead verb's temp dir never becomes layout.
func (mc *mgrCase) learnLayout(ctx context.Context) error {
	dirs, err := checker.ListStoreDirs(mc.dir)
	if err != nil {
		return harnessErr(err)
	}
	vms, err := mc.m.VMs(ctx)
	if err != nil {
		return productErr(ManagerListed, fmt.Errorf("vm list after the unarmed run: %w", err))
	}
	snaps, err := mc.m.Snapshots(ctx)
	if err != nil {
		return productErr(ManagerListed, fmt.Errorf("snapshot list after the unarmed run: %w", err))
	}
	layout := checker.NewLayout(mc.before, dirs, vms, snaps)
	mc.r.mu.Lock()
	defer mc.r.mu.Unlock()
	if mc.r.mgr.layout == nil {
		mc.r.mgr.layout = map[manager.Verb]map[string]bool{}
	}
	mc.r.mgr.layout[mc.mc.Op.Verb] = layout
	return nil
}

// oneLineTail is a refusal's text on one line, for evidence.
func oneLineTail(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
