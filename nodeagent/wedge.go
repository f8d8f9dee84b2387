package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/nodeagent/api"
	"github.com/vmchaos/vmchaos/regress"
)

// A wedge is an intent off its goal whose durable markers did not move for
// longer than its operation's budget. Seed 001 (observability): both of the
// field's wedges emitted log lines only, so nothing outside the node could
// tell a VM was stuck. Here a wedge is counted in a persisted metric
// (nodeagent_wedged_total{op,reason}) and recorded as an event on the API
// (GET /v1/events, persisted in <state>/events.json), naming the VM and the
// reason (docs/architecture.md §6).

const eventsFile = "events.json"

// opBudget is how long an operation may sit without durable progress: the
// longest wait the agent itself allows inside one step, plus one backoff.
// A create or wake waits at most the post-clone readiness budget in one
// step; a hibernate the DHCP release (readiness budget) and a lease-held
// snapshot rm (lease wait); a delete the lease wait. Longer is a wedge (the
// field's busy-create watch sat 30 minutes in one step).
func (a *Agent) opBudget(op string) time.Duration {
	c := a.cfg
	switch op {
	case opCreate, opWake:
		return c.ReadyBudget + c.RetryMax
	case opHibernate:
		return c.ReadyBudget + c.LeaseWait + c.RetryMax
	default:
		return c.LeaseWait + c.RetryMax
	}
}

// budgets is the budget of every operation, in seconds, as GET /v1/events
// publishes them.
func (a *Agent) budgets() map[string]float64 {
	out := map[string]float64{}
	for _, op := range []string{opCreate, opWake, opHibernate, opDelete} {
		out[op] = a.opBudget(op).Seconds()
	}
	return out
}

// eventLog keeps the newest api.EventsKept events, persisted after each add
// so an event survives the restart that often follows a wedge.
type eventLog struct {
	path string
	mu   sync.Mutex
	evs  []api.Event
}

func openEventLog(stateDir string) (*eventLog, error) {
	l := &eventLog{path: filepath.Join(stateDir, eventsFile)}
	b, err := os.ReadFile(l.path)
	if errors.Is(err, os.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	if err := json.Unmarshal(b, &l.evs); err != nil {
		return nil, fmt.Errorf("events: %s is corrupt: %w", l.path, err)
	}
	return l, nil
}

func (l *eventLog) add(ev api.Event) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evs = append(l.evs, ev)
	if n := len(l.evs) - api.EventsKept; n > 0 {
		l.evs = append([]api.Event(nil), l.evs[n:]...)
	}
	b, err := json.Marshal(l.evs)
	if err != nil {
		return err
	}
	if err := durable.WriteFile(l.path, b, 0o644); err != nil {
		return fmt.Errorf("events: %w", err)
	}
	return nil
}

func (l *eventLog) list() []api.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]api.Event{}, l.evs...)
}

// wedgeState is what the wedge watch remembers of one intent: its markers
// at the last change, since when they did not move, and whether this
// episode was reported.
type wedgeState struct {
	fp       string
	since    time.Time
	reported bool
}

// progressKey is the part of a record whose change is progress: the
// operation, its durable step, the lifecycle, the post_clone marker, the
// attempts and the generation. A retry loop that changes none of them (the
// field's busy-create watch, a failed intent waiting for a new generation)
// is no progress.
func progressKey(r *record) string {
	return fmt.Sprintf("%s|%s|%s|%s|%d|%d|%v", r.Op, r.Step, r.Status.Lifecycle, r.Status.PostClone,
		r.Status.FailedAttempts, r.Generation, r.Deleted)
}

// atGoal reports whether the record needs no work.
func atGoal(r *record) bool {
	return !r.Deleted && r.Op == "" && r.Status.Lifecycle == r.goal()
}

// wedgeOp names the operation a record off its goal is stuck in.
func wedgeOp(r *record) string {
	switch {
	case r.Deleted:
		return opDelete
	case r.Op != "":
		return r.Op
	case r.goal() == LifecycleHibernated:
		return opHibernate
	case r.Status.Lifecycle == LifecycleHibernated:
		return opWake
	}
	return opCreate
}

// watchWedges looks at every intent on each tick until ctx ends and reports
// one whose markers did not move for longer than its operation's budget,
// once per episode. Its clock starts at start (the process start), so a
// restart is a fresh episode, as the trace's agent.started is.
func (a *Agent) watchWedges(ctx context.Context, start time.Time) {
	seen := map[string]*wedgeState{}
	tick := a.cfg.ReadyTick
	for first := true; ; first = false {
		now := time.Now()
		live := map[string]bool{}
		for _, n := range a.store.names() {
			rec := a.store.get(n)
			if rec == nil || atGoal(rec) {
				continue
			}
			live[n] = true
			fp := progressKey(rec)
			st := seen[n]
			if st == nil || st.fp != fp {
				// an intent the process found at its start has been
				// without progress since then at least; a later one
				// since it was first seen
				since := now
				if st == nil && first {
					since = start
				}
				seen[n] = &wedgeState{fp: fp, since: since}
				continue
			}
			op := wedgeOp(rec)
			if stuck := now.Sub(st.since); !st.reported && stuck > a.opBudget(op) {
				st.reported = true
				a.reportWedge(ctx, rec, op, stuck)
			}
		}
		for n := range seen {
			if !live[n] {
				delete(seen, n)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(tick):
		}
	}
}

// reportWedge makes a wedge visible outside the node: a persisted counter
// and a persisted event on the API, each naming the reason (the event also
// the VM, which a metric label must not carry).
func (a *Agent) reportWedge(ctx context.Context, rec *record, op string, stuck time.Duration) {
	reason := api.ReasonNoProgress
	if rec.Status.Lifecycle == LifecycleFailed && rec.Status.FailedReason != "" {
		reason = rec.Status.FailedReason
	}
	budget := a.opBudget(op)
	msg := fmt.Sprintf("%s of %s made no progress for %v (budget %v): lifecycle %q, step %q, reason %s",
		op, rec.Name, stuck.Round(time.Millisecond), budget, rec.Status.Lifecycle, rec.Step, reason)
	a.log.Warn("intent wedged past its operation's budget", "vm", rec.Name, "op", op, "step", rec.Step,
		"reason", reason, "stuck", stuck, "budget", budget)
	_ = failpoint.Hit(ctx, "agent.wedged", failpoint.Attrs{"vm": rec.Name, "op": op, "reason": reason})
	// wedge-log-only: the field's agent logged the wedge and nothing else.
	if regress.On("wedge-log-only") {
		return
	}
	a.metrics.inc(mWedged, op, reason)
	ev := api.Event{Kind: api.EventWedged, Time: time.Now().UTC(), MonoNs: failpoint.Now(), VM: rec.Name, Op: op,
		Step: rec.Step, Lifecycle: rec.Status.Lifecycle, Reason: reason, Message: msg, StuckSecs: stuck.Seconds()}
	if err := a.events.add(ev); err != nil {
		a.log.Error("cannot record the wedge event", "vm", rec.Name, "err", err)
	}
}

func (a *Agent) handleEvents(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		methodNotAllowed(w, "GET")
		return
	}
	writeJSON(w, http.StatusOK, api.Events{Budgets: a.budgets(), Events: a.events.list()})
}
