package injector

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
)

// stack is a supervisor + trace + injector with one helper unit.
type stack struct {
	sup Supervisor
	tr  *Trace
	inj *Injector
	ctl string
	dir string
}

func newStack(t *testing.T, kind string) *stack {
	t.Helper()
	sup := newSup(t, kind)
	dir := t.TempDir()
	tr, err := ListenTrace(filepath.Join(dir, "trace.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	ctl := filepath.Join(dir, "ctl")
	if err := os.Mkdir(ctl, 0o755); err != nil {
		t.Fatal(err)
	}
	return &stack{sup: sup, tr: tr, inj: New(sup, tr, Options{CtlDir: ctl}), ctl: ctl, dir: dir}
}

// loopUnit starts a helper that hits points every `every`.
func (s *stack) loopUnit(t *testing.T, name, vm, points string, every time.Duration, extraEnv ...string) {
	t.Helper()
	env := append([]string{envHelper + "=loop", "HELPER_VM=" + vm, "HELPER_POINTS=" + points, "HELPER_EVERY=" + every.String(),
		failpoint.EnvTrace + "=" + s.tr.Path(), failpoint.EnvCtl + "=" + s.ctl}, extraEnv...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.sup.Start(ctx, UnitSpec{Name: name, Argv: helperArgv(t), Env: env, RestartSec: 20 * time.Millisecond,
		TimeoutStopSec: 5 * time.Second, LogPath: filepath.Join(s.dir, name+".log")}); err != nil {
		t.Fatal(err)
	}
	if err := s.sup.WaitActive(ctx, name); err != nil {
		t.Fatal(err)
	}
}

func TestAtTriggerKillsMainAfterNthHitPlusOffset(t *testing.T) {
	s := newStack(t, KindBuiltin)
	s.loopUnit(t, "victim", "vm-a", "t.tick", 5*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before, _ := s.sup.MainPID(ctx, "victim")
	a, err := s.inj.Arm(ctx, Fault{Kind: FaultSigkillMain, Unit: "victim"}, MustParseTrigger("at t.tick#3@vm=vm-a + 7ms"))
	if err != nil {
		t.Fatal(err)
	}
	inj, err := a.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !inj.Landed || inj.Err != "" {
		t.Fatalf("not landed: %+v", inj)
	}
	if inj.VictimPID != before {
		t.Fatalf("victim %d, want main %d", inj.VictimPID, before)
	}
	if inj.ActualNs < inj.RequestedNs || inj.RequestedNs != inj.TriggerNs+int64(7*time.Millisecond) {
		t.Fatalf("requested %d (hit %d + 7ms), actual %d", inj.RequestedNs, inj.TriggerNs, inj.ActualNs)
	}
	// the third hit since Arm fired it
	var n int
	for _, e := range s.tr.Events() {
		if e.Point == "t.tick" && e.TsNs <= inj.TriggerNs && e.Pid == inj.TriggerPID {
			n++
		}
	}
	if n < 3 {
		t.Fatalf("fired at hit %d of pid %d, want ≥ 3", n, inj.TriggerPID)
	}
	waitFor(t, "restart", 30*time.Second, func() bool { p, _ := s.sup.MainPID(ctx, "victim"); return p != 0 && p != before })
	if inj.LastPhase != "t.tick" {
		t.Fatalf("last phase %q", inj.LastPhase)
	}
}

// TestParkLastPhaseIsTheParkedPoint: over 100 runs the victim is killed while
// parked at the point, so its last phase is that point every time.
func TestParkLastPhaseIsTheParkedPoint(t *testing.T) {
	runs := 100
	if testing.Short() {
		runs = 10
	}
	s := newStack(t, KindBuiltin)
	s.loopUnit(t, "parked", "vm-p", "p.before,p.parked,p.after", time.Millisecond, failpoint.EnvFailpoints+"=p.parked=pause")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for i := 0; i < runs; i++ {
		a, err := s.inj.Arm(ctx, Fault{Kind: FaultSigkillMain, Unit: "parked"}, MustParseTrigger("park p.parked"))
		if err != nil {
			t.Fatal(err)
		}
		inj, err := a.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !inj.Landed || inj.LastPhase != "p.parked" {
			t.Fatalf("run %d: landed=%v last phase %q err %q", i, inj.Landed, inj.LastPhase, inj.Err)
		}
		if p, err := Identify(inj.VictimPID); err == nil && p.Alive() && environHas(p.PID, envHelper+"=loop") {
			t.Fatalf("run %d: victim %d still alive", i, inj.VictimPID)
		}
	}
}

func TestSigkillChildKillsTheInFlightChild(t *testing.T) {
	s := newStack(t, KindBuiltin)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := s.inj.Arm(ctx, Fault{Kind: FaultSigkillChild, Unit: "agent", Child: "snapshot-save"}, MustParseTrigger("at agent.child.exec + 5ms"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.sup.Start(ctx, UnitSpec{Name: "agent", Argv: helperArgv(t), Env: []string{envHelper + "=exec", failpoint.EnvTrace + "=" + s.tr.Path()},
		RestartSec: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	inj, err := a.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !inj.Landed {
		t.Fatalf("not landed: %+v", inj)
	}
	main, _ := s.sup.MainPID(ctx, "agent")
	if inj.VictimPID == main {
		t.Fatalf("killed the main process, not the child")
	}
	h, err := s.tr.Wait(ctx, 0, 1, func(e *failpoint.Event) bool {
		return e.Point == "agent.child.exit" && childPID(*e) == inj.VictimPID
	})
	if err != nil {
		t.Fatal(err)
	}
	if msg, _ := h.Event.Attrs["err"].(string); !strings.Contains(msg, "killed") {
		t.Fatalf("child exit %q, want killed", msg)
	}
	// children run for another VM are never picked
	if inj := s.inj.Inject(ctx, Fault{Kind: FaultSigkillChild, Unit: "agent", VM: "other-vm"}); inj.Landed || !strings.Contains(inj.Err, "no in-flight agent child") {
		t.Fatalf("sigkill-child for a VM without children: %+v", inj)
	}
}

// TestSigkillChildAtAParkKillsTheParkedChild: a save child parked at its own
// point is the victim of sigkill-child fired with that hit, though a later
// child of the same kind was exec'd since and has not exited (the CI flake of
// s001-3-pending-holder: the restarted agent's next save was killed instead).
func TestSigkillChildAtAParkKillsTheParkedChild(t *testing.T) {
	s := newStack(t, KindBuiltin)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ready := filepath.Join(s.dir, "ready")
	if err := s.sup.Start(ctx, UnitSpec{Name: "agent", Argv: helperArgv(t), Env: []string{envHelper + "=exec2",
		failpoint.EnvTrace + "=" + s.tr.Path(), failpoint.EnvCtl + "=" + s.ctl, "HELPER_READY=" + ready}}); err != nil {
		t.Fatal(err)
	}
	parked, err := failpoint.WaitParked(ctx, s.ctl, "t.pending")
	if err != nil {
		t.Fatal(err)
	}
	hit, err := s.tr.WaitPoint(ctx, 0, "t.pending", 1, "")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(ready)
	later, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	laterProc, err := Identify(later)
	if err != nil {
		t.Fatalf("the later child %q: %v", b, err)
	}
	inj := s.inj.InjectHit(ctx, Fault{Kind: FaultSigkillChild, Unit: "agent", Child: "snapshot-save"}, hit)
	if !inj.Landed || inj.VictimPID != parked {
		t.Fatalf("sigkill-child at the park: victim %d (landed %v, err %q), want the parked child %d, not the later %d",
			inj.VictimPID, inj.Landed, inj.Err, parked, later)
	}
	if !laterProc.Alive() {
		t.Fatalf("the later child %d was killed too", later)
	}
}

func TestStopFaultStartsAgainAfterStopFor(t *testing.T) {
	s := newStack(t, KindBuiltin)
	s.loopUnit(t, "svc", "vm-s", "s.tick", 5*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before, _ := s.sup.MainPID(ctx, "svc")
	a, err := s.inj.Arm(ctx, Fault{Kind: FaultStop, Unit: "svc", StopFor: 200 * time.Millisecond}, MustParseTrigger("at s.tick + 0"))
	if err != nil {
		t.Fatal(err)
	}
	inj, err := a.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !inj.Landed || inj.ResumedNs-inj.ActualNs < int64(200*time.Millisecond) {
		t.Fatalf("stop fault: %+v", inj)
	}
	after, _ := s.sup.MainPID(ctx, "svc")
	if after == 0 || after == before {
		t.Fatalf("not started again: main %d (was %d)", after, before)
	}
}

// restartFirstSup answers MainPID, once blocked, only after Restart was
// called, and then with the main the restart found: a supervisor whose
// main-pid round trip is slower than any offset (its answer, sent before
// the restart, names the main as it was when asked).
type restartFirstSup struct {
	Supervisor
	block     atomic.Bool
	restarted chan struct{}
	once      sync.Once
	main      int // the main when Restart was called; read after restarted
}

func (s *restartFirstSup) MainPID(ctx context.Context, unit string) (int, error) {
	if s.block.Load() {
		select {
		case <-s.restarted:
			return s.main, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return s.Supervisor.MainPID(ctx, unit)
}

func (s *restartFirstSup) Restart(ctx context.Context, unit string) error {
	s.once.Do(func() {
		s.main, _ = s.Supervisor.MainPID(ctx, unit)
		close(s.restarted)
	})
	return s.Supervisor.Restart(ctx, unit)
}

// TestRestartAtTriggerDoesNotWaitForTheNewMainPID: a restart armed on a
// point that the unit's next main hits, after the main it read ahead
// died, fires without first asking the supervisor for the new main (the
// fault needs no pid; a round trip there put it milliseconds past its
// offset), and the record still names the main it restarted. The
// supervisor here answers MainPID only after Restart: asked first, the
// fault would never go out.
func TestRestartAtTriggerDoesNotWaitForTheNewMainPID(t *testing.T) {
	s := newStack(t, KindBuiltin)
	inner := s.sup
	sup := &restartFirstSup{Supervisor: inner, restarted: make(chan struct{})}
	s.sup, s.inj = sup, New(sup, s.tr, Options{CtlDir: s.ctl})
	s.loopUnit(t, "victim", "vm-a", "r.tick", 5*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old, _ := inner.MainPID(ctx, "victim")
	// the 40th hit comes well after the kill below and RestartSec (20 ms):
	// from the next main
	a, err := s.inj.Arm(ctx, Fault{Kind: FaultRestart, Unit: "victim"}, MustParseTrigger("at r.tick#40 + 2ms"))
	if err != nil {
		t.Fatal(err)
	}
	sup.block.Store(true)
	if err := inner.KillMain(ctx, "victim", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	inj, err := a.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-sup.restarted:
	default:
		t.Fatalf("the restart never went out: %+v", inj)
	}
	if inj.Err != "" || inj.VictimPID == 0 || inj.VictimPID == old || inj.VictimPID != sup.main {
		t.Fatalf("restart after the main changed: err %q, victim %d, want the main it restarted, %d (the killed main was %d)",
			inj.Err, inj.VictimPID, sup.main, old)
	}
}
