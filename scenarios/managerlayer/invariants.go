package managerlayer

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/reports"
)

// Convergence: the state invariants must hold on stablePolls consecutive
// polls within convergeBudget of the end of the recovery.
const (
	convergeBudget = 10 * time.Second
	pollEvery      = 250 * time.Millisecond
	stablePolls    = 3
)

// observation is one poll of the manager's observable state.
type observation struct {
	vms     []manager.VM
	vmsErr  error
	vmms    map[int]string // live VMM pid of this store → VM id from its argv
	temps   []string
	tempErr error
}

func (cr *caseRun) observe(ctx context.Context) observation {
	var o observation
	o.vms, o.vmsErr = cr.m.VMs(ctx)
	o.vmms = map[int]string{}
	for _, p := range tagged(cr.tag) {
		if id, ok := cr.m.VMMOf(p.Argv); ok {
			o.vmms[p.PID] = id
		}
	}
	o.temps, o.tempErr = cr.m.TempDirs(ctx)
	for i, t := range o.temps {
		if rel, err := filepath.Rel(cr.dir, t); err == nil && !strings.HasPrefix(rel, "..") {
			o.temps[i] = "<store>/" + rel
		}
	}
	return o
}

// stateCheck is one manager invariant, read only from observable state.
type stateCheck struct {
	name  string
	check func(ctx context.Context, m manager.Manager, o observation) (bool, string)
}

// stateChecks is the table of manager invariants (docs/architecture.md §14, issue
// 17 item 3). A check whose data source failed never passes.
var stateChecks = []stateCheck{
	{"one-vm-per-name", func(_ context.Context, _ manager.Manager, o observation) (bool, string) {
		if o.vmsErr != nil {
			return false, "data missing: " + o.vmsErr.Error()
		}
		byName := map[string][]string{}
		for _, v := range o.vms {
			byName[v.Name] = append(byName[v.Name], v.ID+"("+v.State+")")
		}
		var bad []string
		for n, ids := range byName {
			if len(ids) > 1 {
				bad = append(bad, fmt.Sprintf("%s: %s", n, strings.Join(ids, ", ")))
			}
		}
		return len(bad) == 0, strings.Join(sorted(bad), "; ")
	}},
	// Every verb has exited and the recovery has run: nothing owns a
	// creating record any more, so one that is left holds its name forever.
	{"no-creating-after-recovery", func(_ context.Context, _ manager.Manager, o observation) (bool, string) {
		if o.vmsErr != nil {
			return false, "data missing: " + o.vmsErr.Error()
		}
		var bad []string
		for _, v := range o.vms {
			if v.State == manager.StateCreating {
				bad = append(bad, fmt.Sprintf("%s %q is creating with its owner dead", v.ID, v.Name))
			}
		}
		return len(bad) == 0, strings.Join(bad, "; ")
	}},
	// A VMM belongs to exactly one running record whose pid it is.
	{"no-orphan-vmm", func(_ context.Context, _ manager.Manager, o observation) (bool, string) {
		if o.vmsErr != nil {
			return false, "data missing: " + o.vmsErr.Error()
		}
		recs := map[string]manager.VM{}
		for _, v := range o.vms {
			recs[v.ID] = v
		}
		var bad []string
		for pid, id := range o.vmms {
			v, ok := recs[id]
			switch {
			case !ok:
				bad = append(bad, fmt.Sprintf("VMM pid %d of %s has no record", pid, id))
			case v.State != manager.StateRunning:
				bad = append(bad, fmt.Sprintf("VMM pid %d of %s %q lives under a %s record", pid, id, v.Name, v.State))
			case v.PID != pid:
				bad = append(bad, fmt.Sprintf("VMM pid %d of %s %q is not the record's pid %d", pid, id, v.Name, v.PID))
			}
		}
		return len(bad) == 0, strings.Join(sorted(bad), "; ")
	}},
	{"no-running-with-dead-vmm", func(_ context.Context, _ manager.Manager, o observation) (bool, string) {
		if o.vmsErr != nil {
			return false, "data missing: " + o.vmsErr.Error()
		}
		var bad []string
		for _, v := range o.vms {
			if v.State == manager.StateRunning && o.vmms[v.PID] != v.ID {
				bad = append(bad, fmt.Sprintf("%s %q is running with pid %d, which is not its live VMM", v.ID, v.Name, v.PID))
			}
		}
		return len(bad) == 0, strings.Join(bad, "; ")
	}},
	// Asked through the VMM's own API: a running record over a Paused VMM
	// is a guest frozen with nobody left to resume it.
	{"no-paused-running", func(ctx context.Context, m manager.Manager, o observation) (bool, string) {
		if o.vmsErr != nil {
			return false, "data missing: " + o.vmsErr.Error()
		}
		var bad []string
		for _, v := range o.vms {
			if v.State != manager.StateRunning || o.vmms[v.PID] != v.ID {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			c := chapi.New(m.APISocket(v.ID))
			info, err := c.Info(cctx)
			c.Close()
			cancel()
			switch {
			case err != nil:
				bad = append(bad, fmt.Sprintf("%s %q: vm.info: %v (data missing)", v.ID, v.Name, err))
			case info.State == chapi.StatePaused:
				bad = append(bad, fmt.Sprintf("%s %q: record running, VMM pid %d says %s", v.ID, v.Name, v.PID, info.State))
			}
		}
		return len(bad) == 0, strings.Join(bad, "; ")
	}},
	{"no-leftover-temp-dirs", func(_ context.Context, _ manager.Manager, o observation) (bool, string) {
		if o.tempErr != nil {
			return false, "data missing: " + o.tempErr.Error()
		}
		return len(o.temps) == 0, strings.Join(o.temps, ", ")
	}},
}

func sorted(s []string) []string {
	sort.Strings(s)
	return s
}

// converge polls the state invariants until they all hold on stablePolls
// consecutive polls, or the budget ends; it returns the invariants of the
// last poll and the CLOCK_MONOTONIC time of the stable streak's first poll
// (0 if none).
func (cr *caseRun) converge(ctx context.Context) ([]reports.Invariant, int64) {
	deadline := time.Now().Add(convergeBudget)
	streak, streakNs := 0, int64(0)
	var invs []reports.Invariant
	for {
		ns := failpoint.Now()
		o := cr.observe(ctx)
		invs = invs[:0]
		ok := true
		for _, sc := range stateChecks {
			good, ev := sc.check(ctx, cr.m, o)
			invs = append(invs, reports.Invariant{Name: sc.name, OK: good, Evidence: ev})
			ok = ok && good
		}
		if ok {
			if streak == 0 {
				streakNs = ns
			}
			streak++
			if streak >= stablePolls {
				return invs, streakNs
			}
		} else {
			streak = 0
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return invs, 0
		}
		time.Sleep(pollEvery)
	}
}

// streamWait bounds how long the event stream may lag the list (cocoon
// polls every whole second besides its fsnotify wake-ups).
const streamWait = 5 * time.Second

// streamMatches: the event stream ends where the store ends. For every VM
// the list shows, the stream's last event carries the state the list
// implies (a running record whose VMM is dead reads "stopped (stale)"); a
// VM the stream still shows is in the list. A VMM death or a state change
// the stream never reported fails here.
func (cr *caseRun) streamMatches(ctx context.Context) reports.Invariant {
	inv := reports.Invariant{Name: "events-match-state"}
	deadline := time.Now().Add(streamWait)
	for {
		bad, err := cr.streamDiff(ctx)
		switch {
		case err != nil:
			inv.Evidence = "data missing: " + err.Error()
		case len(bad) == 0:
			inv.OK = true
			return inv
		default:
			inv.Evidence = strings.Join(bad, "; ")
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return inv
		}
		time.Sleep(pollEvery)
	}
}

func (cr *caseRun) streamDiff(ctx context.Context) ([]string, error) {
	o := cr.observe(ctx)
	if o.vmsErr != nil {
		return nil, o.vmsErr
	}
	var evs []manager.Event
	for _, e := range cr.events.since(0) {
		evs = append(evs, e.ev)
	}
	return diffStream(o, evs), nil
}

// diffStream compares the stream's last event per VM with the observed
// store.
func diffStream(o observation, evs []manager.Event) []string {
	last := map[string]manager.Event{}
	for _, e := range evs {
		last[e.ID] = e
	}
	var bad []string
	listed := map[string]bool{}
	for _, v := range o.vms {
		listed[v.ID] = true
		want := v.State
		if want == manager.StateRunning && o.vmms[v.PID] != v.ID {
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
	return sorted(bad)
}
