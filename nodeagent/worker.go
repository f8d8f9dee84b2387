package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/regress"
)

// worker serialises every operation of one VM name: exactly one goroutine
// drives a name, so no two operations on a VM ever overlap inside the agent.
type worker struct {
	kick chan struct{}
}

// opError carries the reason label a failure is recorded under.
type opError struct {
	reason string
	err    error
}

func (e *opError) Error() string { return e.reason + ": " + e.err.Error() }
func (e *opError) Unwrap() error { return e.err }

func opErr(reason string, err error) error {
	if err == nil {
		return nil
	}
	var oe *opError
	if errors.As(err, &oe) {
		return err
	}
	return &opError{reason: reason, err: err}
}

// kick wakes the worker of name, starting one if needed. resumed marks the
// first pass as a resumed operation (startup): it holds the resume claim until
// that pass ends. sem bounds the fan-out of first passes at startup.
func (a *Agent) kick(ctx context.Context, name string, resumed bool, sem chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.kickLocked(ctx, name, resumed, sem)
}

func (a *Agent) kickLocked(ctx context.Context, name string, resumed bool, sem chan struct{}) {
	if w := a.workers[name]; w != nil {
		select {
		case w.kick <- struct{}{}:
		default:
		}
		return
	}
	w := &worker{kick: make(chan struct{}, 1)}
	a.workers[name] = w
	if resumed {
		a.claims[name] = true
	}
	a.wg.Add(1)
	go a.runWorker(ctx, name, w, resumed, sem)
}

func (a *Agent) runWorker(ctx context.Context, name string, w *worker, resumed bool, sem chan struct{}) {
	defer a.wg.Done()
	first := true
	for {
		if first && sem != nil {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
		}
		wait, forgotten := a.pass(ctx, name, resumed)
		if first && sem != nil {
			<-sem
		}
		if resumed {
			a.mu.Lock()
			delete(a.claims, name)
			a.mu.Unlock()
			resumed = false
		}
		first = false
		if ctx.Err() != nil {
			return
		}
		if forgotten {
			a.mu.Lock()
			if a.store.get(name) == nil {
				delete(a.workers, name)
				a.mu.Unlock()
				return
			}
			a.mu.Unlock()
			continue // a new intent for the name arrived meanwhile
		}
		var timer *time.Timer
		var fire <-chan time.Time
		if wait > 0 {
			timer = time.NewTimer(wait)
			fire = timer.C
		}
		select {
		case <-w.kick:
		case <-fire:
		case <-ctx.Done():
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// pass runs the owed work of name once. It returns how long to wait before the
// next automatic pass (0: only on a kick) and whether the record is gone.
func (a *Agent) pass(ctx context.Context, name string, resumed bool) (time.Duration, bool) {
	rec := a.store.get(name)
	if rec == nil {
		return 0, true
	}
	// A failure of an older generation does not delay the new one.
	// post-clone-failed-dispatched: the historical resumed pass ran past
	// the failed path's parking and backoff.
	bypass := resumed && regress.On("post-clone-failed-dispatched")
	if rec.Status.Lifecycle == LifecycleFailed && !rec.Deleted && rec.FailedGen == rec.Generation && !bypass {
		if a.parked(rec) {
			return 0, false
		}
		if d := time.Until(rec.Status.UpdatedAt.Add(a.backoff(rec.Status.FailedAttempts))); d > 0 {
			return d, false
		}
	}
	op := rec.Op
	start := time.Now()
	err := a.advance(ctx, name, resumed)
	if op == "" {
		if r := a.store.get(name); r != nil {
			op = r.Op
		}
	}
	if op == "" {
		op = "steady"
	}
	if err == nil {
		a.metrics.observe(op, "ok", time.Since(start))
		return 0, a.store.get(name) == nil
	}
	if ctx.Err() != nil {
		// Shutdown: the markers stay exactly as written; the next start
		// derives the same owed work from them.
		a.log.Info("operation interrupted by shutdown", "vm", name, "op", op, "err", err)
		return 0, false
	}
	a.metrics.observe(op, "failed", time.Since(start))
	return a.fail(ctx, name, op, err), false
}

// parked reports whether a failed record waits for a new generation.
func (a *Agent) parked(rec *record) bool {
	// failed-sticky: the historical bug parked every failure for the rest
	// of its generation.
	if regress.On("failed-sticky") {
		return rec.FailedGen == rec.Generation
	}
	return rec.Status.FailedAttempts > a.cfg.RetryAttempts
}

func (a *Agent) backoff(attempts int) time.Duration {
	d := a.cfg.RetryBase
	for i := 1; i < attempts && d < a.cfg.RetryMax; i++ {
		d *= 2
	}
	if d > a.cfg.RetryMax {
		d = a.cfg.RetryMax
	}
	return d
}

// fail records why an operation failed. failed is a report, not a parking
// lot: the worker retries with backoff up to --retry-attempts, and any new
// intent generation resets the count (seed 001 #5).
func (a *Agent) fail(ctx context.Context, name, op string, err error) time.Duration {
	reason := "unknown"
	var oe *opError
	if errors.As(err, &oe) {
		reason = oe.reason
	}
	var attempts int
	rec, uerr := a.store.update(name, func(r *record) error {
		r.Status.FailedAttempts++
		attempts = r.Status.FailedAttempts
		r.FailedGen = r.Generation
		r.Status.Lifecycle = LifecycleFailed
		r.Status.FailedReason = reason
		msg := fmt.Sprintf("%s failed (attempt %d): %v", op, attempts, err)
		if op == opHibernate && r.Status.VMID != "" {
			msg += "; the VM is still alive and not saved"
		}
		switch {
		case regress.On("failed-sticky"):
		case attempts > a.cfg.RetryAttempts:
			msg += fmt.Sprintf("; automatic retries exhausted (%d), PUT the intent again to retry", a.cfg.RetryAttempts)
		default:
			msg += fmt.Sprintf("; retrying in %v", a.backoff(attempts))
		}
		r.Status.Message = msg
		r.Status.UpdatedAt = time.Now().UTC()
		return nil
	})
	if uerr != nil {
		a.log.Error("cannot record failure", "vm", name, "err", err, "store_err", uerr)
		return a.cfg.RetryBase
	}
	a.metrics.inc(mFailed, reason)
	// One outcome per wake (seed 001, observability: a retry storm put 33
	// failures on one wake): a wake counts failed once, when it gives up;
	// every failed retry is already in lifecycle_failed_total{reason}.
	// wake-failed-per-retry: the historical count of every failed pass.
	if op == opWake && (a.parked(rec) || regress.On("wake-failed-per-retry")) {
		a.metrics.inc(mWake, "failed")
	}
	a.log.Warn("operation failed", "vm", name, "op", op, "reason", reason, "attempt", attempts, "err", err)
	_ = failpoint.Hit(ctx, "agent.failed", failpoint.Attrs{"vm": name, "reason": reason})
	if a.parked(rec) {
		return 0
	}
	return a.backoff(attempts)
}

// advance drives name towards its goal until reached or an error.
func (a *Agent) advance(ctx context.Context, name string, resumed bool) error {
	for i := 0; i < 16; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		rec := a.store.get(name)
		if rec == nil {
			return nil
		}
		var err error
		switch {
		case rec.Deleted:
			return a.doDelete(ctx, rec)
		case rec.Op == opHibernate && !rec.Intent.Hibernate && hibernateOrder[rec.Step] < hibernateOrder[stepSaved]:
			err = a.doUnhibernate(ctx, rec)
		case rec.Op == opHibernate:
			err = a.doHibernate(ctx, rec, resumed)
		case rec.Op == opCreate || rec.Op == opWake:
			err = a.doCreate(ctx, rec)
		default:
			next, reached, serr := a.nextOp(rec)
			if serr != nil {
				return serr
			}
			if reached {
				return nil
			}
			if _, err := a.store.update(name, func(r *record) error {
				r.Op, r.Step, r.EvidenceChecked = next.op, next.step, false
				return nil
			}); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		resumed = false
	}
	return fmt.Errorf("vm %s: no progress after 16 operations", name)
}

type plan struct{ op, step string }

// nextOp decides, from the durable markers only, which operation a record
// with no operation in flight owes.
func (a *Agent) nextOp(rec *record) (plan, bool, error) {
	lc := rec.Status.Lifecycle
	goal := rec.goal()
	if goal == LifecycleReady {
		switch {
		case lc == LifecycleHibernated:
			return plan{op: opWake}, false, nil
		case lc == LifecycleReady && rec.Status.VMID != "":
			if a.takeDied(rec.Name, rec.Status.VMID) {
				// The watcher saw the VM die: verify and restart it.
				return plan{op: opCreate, step: stepCloned}, false, nil
			}
			return plan{}, true, nil
		default:
			return plan{op: opCreate}, false, nil
		}
	}
	switch lc {
	case LifecycleHibernated:
		return plan{}, true, nil
	case LifecycleReady:
		return plan{op: opHibernate}, false, nil
	case "", LifecycleFailed, LifecycleCreating:
		// A hibernate intent on a VM that is not ready yet: make it ready
		// first (the API refuses this order, a restart may still see it).
		return plan{op: opCreate}, false, nil
	}
	return plan{}, false, fmt.Errorf("vm %s: lifecycle %q with no operation and goal %s", rec.Name, lc, goal)
}

// takeDied reports (once) whether the watcher saw the VM bound as id die;
// a death noted for another VM of the name (one a hibernate removed) is
// dropped.
func (a *Agent) takeDied(name, id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	d, ok := a.died[name]
	delete(a.died, name)
	return ok && d == id
}

// setStatus writes a status change durably.
func (a *Agent) setStatus(name string, f func(r *record)) (*record, error) {
	return a.store.update(name, func(r *record) error {
		f(r)
		r.Status.UpdatedAt = time.Now().UTC()
		return nil
	})
}

// hit marks a phase; an injected error fails the operation under reason.
func hit(ctx context.Context, point, name, reason string) error {
	if err := failpoint.Hit(ctx, point, failpoint.Attrs{"vm": name}); err != nil {
		return opErr(reason, fmt.Errorf("%s: %w", point, err))
	}
	return nil
}
