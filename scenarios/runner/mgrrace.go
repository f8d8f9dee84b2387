package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// Invariants of a race (issue 32 item 2).
const (
	// RacerHeldOff: while the verb under test was parked, the racing verb
	// did not report success (its lease or lock made it refuse or wait),
	// and, where only one may win, the two did not both succeed.
	RacerHeldOff = "racer-held-off"
	// RacedVerbSucceeds: released, the verb under test succeeded.
	RacedVerbSucceeds = "raced-verb-succeeds"
)

// raceWait bounds each verb's exit once the park is released.
const raceWait = 30 * time.Second

// raceResult is what the two verbs of a race did.
type raceResult struct {
	verbCode, racerCode int
	racerWonParked      bool // the racer exited 0 while the verb was parked
	racerEndedParked    bool // the racer exited (any code) while the verb was parked
	verbLog, racerLog   string
}

// race parks the verb under test at its point, runs the racer while it is
// parked, gives the racer the settle time to finish or block, releases the
// park and waits for both. The injection lands when the verb was still
// parked when the racer started.
func (mc *mgrCase) race(ctx context.Context) (reports.Injection, []reports.Invariant, error) {
	r := mc.mc.Race
	inj := reports.Injection{Fault: "race", Trigger: fmt.Sprintf("park %s, then %s", mc.mc.Point, r.Racer.Verb),
		IntendedPhase: mc.mc.Point}
	for _, f := range []string{".release", ".paused"} {
		if err := os.Remove(filepath.Join(mc.ctl, mc.mc.Point+f)); err != nil && !os.IsNotExist(err) {
			return inj, nil, harnessErr(err)
		}
	}
	mark, fromNs, t0 := mc.trace.Mark(), failpoint.Now(), time.Now()
	rv, err := mc.startVerb(mc.mc.Op.Call)
	if err != nil {
		return inj, nil, productErr(ManagerSetup, fmt.Errorf("start the verb: %w", err))
	}
	mc.verbEvs = append(mc.verbEvs, failpoint.Event{TsNs: fromNs, Point: mgrVerbStarted, Pid: rv.cmd.Process.Pid})
	if err := mc.waitToFire(ctx, rv, mark, t0); err != nil {
		return inj, nil, err
	}
	res, err := mc.runRacer(ctx, rv, &inj)
	if err != nil {
		return inj, nil, err
	}
	mc.verbEvs = append(mc.verbEvs, failpoint.Event{TsNs: rv.exitNs, Point: mgrVerbExited, Pid: rv.cmd.Process.Pid})
	return inj, raceInvariants(mc.mc.Race, mc.mc.Point, res), nil
}

// raceHold is how long a racer gets while the verb under test is parked
// before it counts as held off: never under 5 s unscaled, since the park
// holds as long as the harness likes and a slow racer that is still
// running (cocoon's `snapshot rm` at load 50 took more than the scaled
// 200 ms settle) must not read as waiting on a lease it never saw.
func raceHold(settle time.Duration) time.Duration { return max(settle, 5*time.Second) }

// runRacer runs the racer against the parked verb, then releases the park
// and waits for both.
func (mc *mgrCase) runRacer(ctx context.Context, rv *running, inj *reports.Injection) (raceResult, error) {
	r := mc.mc.Race
	inj.RequestedNs = failpoint.Now()
	racer, err := mc.startVerb(r.Racer)
	inj.ActualNs = failpoint.Now()
	if err != nil {
		_ = mc.releasePark()
		return raceResult{}, harnessErr(fmt.Errorf("start the racer: %w", err))
	}
	inj.VictimPID = racer.cmd.Process.Pid
	res := raceResult{verbLog: rv.log, racerLog: racer.log}
	select {
	case code := <-racer.exit:
		racer.exit <- code
		res.racerEndedParked, res.racerWonParked = true, code == 0
	case <-time.After(raceHold(mc.settle())):
	case <-ctx.Done():
	}
	// The race landed when the verb under test was still parked: it has
	// not exited, and its park file is there.
	_, statErr := os.Stat(filepath.Join(mc.ctl, mc.mc.Point+".paused"))
	select {
	case code := <-rv.exit:
		rv.exit <- code
		inj.Landed, inj.Err = false, fmt.Sprintf("%s exited %d before the racer was judged", mc.mc.Op.Verb, code)
	default:
		inj.Landed = statErr == nil
		if !inj.Landed {
			inj.Err = fmt.Sprintf("%s was not parked at %s when the racer ran", mc.mc.Op.Verb, mc.mc.Point)
		}
	}
	inj.LastPhase = "parked at " + mc.mc.Point
	if err := mc.releasePark(); err != nil {
		return res, harnessErr(err)
	}
	if res.verbCode, err = rv.wait(ctx, raceWait); err != nil {
		return res, productErr(RacedVerbSucceeds, err)
	}
	if res.racerCode, err = racer.wait(ctx, raceWait); err != nil {
		return res, productErr(RacerHeldOff, err)
	}
	return res, nil
}

// raceInvariants judges a race from what its two verbs did.
func raceInvariants(r *scenarios.MgrRace, point string, res raceResult) []reports.Invariant {
	var out []reports.Invariant
	if r.HoldOff || r.OneWins {
		inv := reports.Invariant{Name: RacerHeldOff, OK: true}
		switch {
		case r.HoldOff && res.racerWonParked:
			inv.OK = false
			inv.Evidence = fmt.Sprintf("%s exited 0 while %s was parked at %s: nothing held it off", r.Racer.Verb, r.Op.Verb, point)
		case r.OneWins && res.verbCode == 0 && res.racerCode == 0:
			inv.OK = false
			inv.Evidence = fmt.Sprintf("%s and the racing %s both succeeded: only one may", r.Op.Verb, r.Racer.Verb)
		case res.racerEndedParked:
			inv.Evidence = fmt.Sprintf("%s refused while %s was parked (exit %d: %s)", r.Racer.Verb, r.Op.Verb, res.racerCode, logTail(res.racerLog, 1))
		default:
			inv.Evidence = fmt.Sprintf("%s was still running %s after it started while %s was parked (held off), then exited %d",
				r.Racer.Verb, raceHold(0), r.Op.Verb, res.racerCode)
		}
		out = append(out, inv)
	}
	if r.VerbMustSucceed {
		inv := reports.Invariant{Name: RacedVerbSucceeds, OK: res.verbCode == 0,
			Evidence: fmt.Sprintf("%s exited %d once released", r.Op.Verb, res.verbCode)}
		if !inv.OK {
			inv.Evidence += ": " + logTail(res.verbLog, 2)
		}
		out = append(out, inv)
	}
	return out
}
