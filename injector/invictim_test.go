package injector

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
)

// TestInVictimMainKillsItselfAtHitPlusOffset: the unit's main process arms
// signal(KILL, 7ms) at its own first hit; the injector records it from the
// victim's failpoint.signal datagram: the main pid at Arm, requested = hit +
// 7ms exactly, actual its own stamp, landed in the trigger point.
func TestInVictimMainKillsItselfAtHitPlusOffset(t *testing.T) {
	for _, kind := range []string{KindBuiltin, KindSandbox} {
		t.Run(kind, func(t *testing.T) {
			if kind == KindSandbox && SandboxPreflight() != "" {
				t.Skip(SandboxPreflight())
			}
			s := newStack(t, kind)
			f := Fault{Kind: FaultSigkillMain, Unit: "victim"}
			tg := MustParseTrigger("at t.tick@vm=vm-a + 7ms")
			spec, err := VictimSpec(f, tg)
			if err != nil || spec != "t.tick=1*signal(KILL,7000us)@vm=vm-a" {
				t.Fatalf("VictimSpec = %q, %v", spec, err)
			}
			mark := s.tr.Mark()
			// The first hit comes after Arm: the main pid Arm reads is the
			// process that hits.
			s.loopUnit(t, "victim", "vm-a", "t.tick", 5*time.Millisecond, failpoint.EnvFailpoints+"="+spec, "HELPER_FIRST_HIT_AFTER=300ms")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			before, _ := s.sup.MainPID(ctx, "victim")
			a, err := s.inj.Arm(ctx, f, tg, From(mark), InVictim())
			if err != nil {
				t.Fatal(err)
			}
			inj, err := a.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !inj.Landed || inj.Err != "" || !inj.InVictim || inj.LastPhase != "t.tick" {
				t.Fatalf("not landed in t.tick: %+v", inj)
			}
			if inj.VictimPID != before {
				t.Fatalf("victim %d, want main %d", inj.VictimPID, before)
			}
			if inj.TriggerNs == 0 || inj.RequestedNs != inj.TriggerNs+int64(7*time.Millisecond) || inj.ActualNs < inj.RequestedNs {
				t.Fatalf("hit %d, requested %d (want hit + 7ms), actual %d", inj.TriggerNs, inj.RequestedNs, inj.ActualNs)
			}
			waitFor(t, "restart", 30*time.Second, func() bool { p, _ := s.sup.MainPID(ctx, "victim"); return p != 0 && p != before })
			if lost := s.tr.Lost(); len(lost) != 0 {
				t.Fatalf("datagrams lost: %v", lost)
			}
		})
	}
}

// TestInVictimRefusesWhatItCannotArm: only a signal to the process that hits
// an `at` point at its first hit can be armed inside it.
func TestInVictimRefusesWhatItCannotArm(t *testing.T) {
	for _, tc := range []struct {
		f    Fault
		trig string
		why  string
	}{
		{Fault{Kind: FaultStop, Unit: "u"}, "at p + 1ms", "not a signal"},
		{Fault{Kind: FaultKillAll, Unit: "u"}, "at p + 1ms", "not a signal"},
		{Fault{Kind: FaultSigkillMain, Unit: "u"}, "at p#2 + 1ms", "first hit"},
		{Fault{Kind: FaultSigkillMain, Unit: "u"}, "park p", "first hit"},
	} {
		if _, err := VictimSpec(tc.f, MustParseTrigger(tc.trig)); err == nil || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("%s %s: %v, want an error about %q", tc.f, tc.trig, err, tc.why)
		}
	}
	s := newStack(t, KindBuiltin)
	if _, err := s.inj.Arm(context.Background(), Fault{Kind: FaultRestart, Unit: "u"}, MustParseTrigger("at p + 1ms"), InVictim()); err == nil {
		t.Fatal("Arm accepted an in-victim restart")
	}
	if sp, err := VictimSpec(Fault{Kind: FaultSigstop, Unit: "u"}, MustParseTrigger("at p + 1.5ms")); err != nil || sp != "p=1*signal(STOP,1500us)" {
		t.Fatalf("sigstop spec %q, %v", sp, err)
	}
}

// TestInVictimOnceRestartedVictimDoesNotFireAgain: the unit restarts its
// killed main process with the same environment, so the same
// signal(KILL,7ms,once=T) spec; the token was claimed, so the new process
// goes on hitting the point and lives. One failpoint.signal in the trace.
func TestInVictimOnceRestartedVictimDoesNotFireAgain(t *testing.T) {
	s := newStack(t, KindBuiltin)
	f := Fault{Kind: FaultSigkillMain, Unit: "victim"}
	tg := MustParseTrigger("at t.tick + 7ms")
	spec, err := VictimSpecOnce(f, tg, "case-1")
	if err != nil || spec != "t.tick=1*signal(KILL,7000us,once=case-1)" {
		t.Fatalf("VictimSpecOnce = %q, %v", spec, err)
	}
	mark := s.tr.Mark()
	s.loopUnit(t, "victim", "vm-a", "t.tick", 5*time.Millisecond, failpoint.EnvFailpoints+"="+spec, "HELPER_FIRST_HIT_AFTER=300ms")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before, _ := s.sup.MainPID(ctx, "victim")
	a, err := s.inj.Arm(ctx, f, tg, From(mark), Once("case-1"))
	if err != nil {
		t.Fatal(err)
	}
	inj, err := a.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !inj.Landed || !inj.InVictim || inj.VictimPID != before {
		t.Fatalf("first incarnation: %+v, want landed in the victim %d", inj, before)
	}
	var after int
	waitFor(t, "restart", 30*time.Second, func() bool { after, _ = s.sup.MainPID(ctx, "victim"); return after != 0 && after != before })
	// The restarted process hits t.tick every 5 ms after its first 300 ms:
	// without the token it would be dead 7 ms after its first hit.
	mark2 := s.tr.Mark()
	if _, err := s.tr.WaitPoint(ctx, mark2, "t.tick", 20, ""); err != nil {
		t.Fatal(err)
	}
	if now, _ := s.sup.MainPID(ctx, "victim"); now != after {
		t.Fatalf("the restarted victim %d died (main now %d): the one-shot action fired again", after, now)
	}
	n := 0
	for _, e := range s.tr.Events() {
		if e.Point == failpoint.SignalPoint {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d failpoint.signal datagrams, want 1", n)
	}
}

// TestSigkillHitterKillsTheProcessThatHit: sigkill-hitter, the runner's
// sigkill-direct, kills the process whose hit fired the trigger, in the
// victim and from the harness, and only when Allow lets it.
func TestSigkillHitterKillsTheProcessThatHit(t *testing.T) {
	for _, mode := range []string{"in-victim", "harness", "refused"} {
		t.Run(mode, func(t *testing.T) {
			s := newStack(t, KindBuiltin)
			f := Fault{Kind: FaultSigkillHitter}
			tg := MustParseTrigger("at t.tick + 3ms")
			var env []string
			opts := []ArmOption{From(s.tr.Mark())}
			if mode == "in-victim" {
				spec, err := VictimSpecOnce(f, tg, "hit-1")
				if err != nil {
					t.Fatal(err)
				}
				env = append(env, failpoint.EnvFailpoints+"="+spec)
				opts = append(opts, Once("hit-1"))
			}
			s.loopUnit(t, "hitter", "vm-a", "t.tick", 5*time.Millisecond, append(env, "HELPER_FIRST_HIT_AFTER=300ms")...)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			main, _ := s.sup.MainPID(ctx, "hitter")
			opts = append(opts, Allow(func(host int) error {
				if mode == "refused" || host != main {
					return fmt.Errorf("not a process the test started")
				}
				return nil
			}))
			a, err := s.inj.Arm(ctx, f, tg, opts...)
			if err != nil {
				t.Fatal(err)
			}
			inj, err := a.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if mode == "refused" {
				if inj.Landed || !strings.Contains(inj.Err, "not a process the test started") {
					t.Fatalf("refused hitter: %+v", inj)
				}
				if now, _ := s.sup.MainPID(ctx, "hitter"); now != main {
					t.Fatalf("a refused hitter %d was killed (main now %d)", main, now)
				}
				return
			}
			if !inj.Landed || inj.Err != "" || inj.VictimPID != main || inj.InVictim != (mode == "in-victim") || inj.LastPhase != "t.tick" {
				t.Fatalf("%+v: want landed on %d", inj, main)
			}
			if inj.RequestedNs != inj.TriggerNs+int64(3*time.Millisecond) || inj.ActualNs < inj.RequestedNs {
				t.Fatalf("hit %d, requested %d, actual %d", inj.TriggerNs, inj.RequestedNs, inj.ActualNs)
			}
			waitFor(t, "restart", 30*time.Second, func() bool { p, _ := s.sup.MainPID(ctx, "hitter"); return p != 0 && p != main })
		})
	}
}

// TestInVictimVMMKillsItself: a VMM (argv[0] cloud-hypervisor, --api-socket
// naming its VM) that hits a point of its own is armed with kill -9 in
// itself; the injector identifies it at its hit as the VM's VMM and records
// the kill from its failpoint.signal.
func TestInVictimVMMKillsItself(t *testing.T) {
	s := newStack(t, KindBuiltin)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ch := filepath.Join(s.dir, "cloud-hypervisor")
	if err := os.Symlink(self, ch); err != nil {
		t.Fatal(err)
	}
	f := Fault{Kind: FaultSigkillVMM, VM: "vm-a"}
	tg := MustParseTrigger("at ch.tick@vm=vm-a + 3ms")
	spec, err := VictimSpecOnce(f, tg, "vmm-1")
	if err != nil {
		t.Fatal(err)
	}
	env := []string{envHelper + "=loop", "HELPER_VM=vm-a", "HELPER_POINTS=ch.tick", "HELPER_EVERY=5ms", "HELPER_FIRST_HIT_AFTER=300ms",
		failpoint.EnvTrace + "=" + s.tr.Path(), failpoint.EnvCtl + "=" + s.ctl, failpoint.EnvFailpoints + "=" + spec}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mark := s.tr.Mark()
	if err := s.sup.Start(ctx, UnitSpec{Name: "vmm", Argv: []string{ch, "--api-socket", "path=" + filepath.Join(s.dir, "vm-a", "api.sock")},
		Env: env, RestartSec: 20 * time.Millisecond, TimeoutStopSec: 5 * time.Second, LogPath: filepath.Join(s.dir, "vmm.log")}); err != nil {
		t.Fatal(err)
	}
	if err := s.sup.WaitActive(ctx, "vmm"); err != nil {
		t.Fatal(err)
	}
	vmm, _ := s.sup.MainPID(ctx, "vmm")
	a, err := s.inj.Arm(ctx, f, tg, From(mark), Once("vmm-1"))
	if err != nil {
		t.Fatal(err)
	}
	inj, err := a.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !inj.Landed || inj.Err != "" || !inj.InVictim || inj.VictimPID != vmm || inj.LastPhase != "ch.tick" {
		t.Fatalf("%+v: want landed in the VMM %d", inj, vmm)
	}
	if inj.RequestedNs != inj.TriggerNs+int64(3*time.Millisecond) || inj.ActualNs < inj.RequestedNs {
		t.Fatalf("hit %d, requested %d, actual %d", inj.TriggerNs, inj.RequestedNs, inj.ActualNs)
	}
}

// TestInjectHitKillsTheProcessThatHit: InjectHit fires a sigkill-hitter at
// once at the process a hit names (the runner's sigkill-direct of a parked
// vmctl), through Resolve; a Resolve that refuses leaves it alive.
func TestInjectHitKillsTheProcessThatHit(t *testing.T) {
	s := newStack(t, KindBuiltin)
	s.loopUnit(t, "hitter", "vm-a", "t.tick", 5*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	main, _ := s.sup.MainPID(ctx, "hitter")
	hit, err := s.tr.WaitPoint(ctx, s.tr.Mark(), "t.tick", 1, "")
	if err != nil {
		t.Fatal(err)
	}
	refused := s.inj.InjectHit(ctx, Fault{Kind: FaultSigkillHitter}, hit, Resolve(func(int) (int, error) { return 0, fmt.Errorf("not ours") }))
	if refused.Landed || !strings.Contains(refused.Err, "not ours") {
		t.Fatalf("refused: %+v", refused)
	}
	if now, _ := s.sup.MainPID(ctx, "hitter"); now != main {
		t.Fatalf("a refused hitter %d was killed (main now %d)", main, now)
	}
	inj := s.inj.InjectHit(ctx, Fault{Kind: FaultSigkillHitter}, hit, Resolve(func(pid int) (int, error) { return pid, nil }))
	if !inj.Landed || inj.VictimPID != main || inj.TriggerPID != hit.Event.Pid || inj.ActualNs < inj.RequestedNs {
		t.Fatalf("%+v: want %d killed", inj, main)
	}
	waitFor(t, "restart", 30*time.Second, func() bool { p, _ := s.sup.MainPID(ctx, "hitter"); return p != 0 && p != main })
}

// TestRegistryRestartBetweenRunsWhileTheUnitIsDown: with Between, a
// registry-restart is a stop, Between, a start: Between runs once, with no
// main process in the unit, and the unit has a new main after; without it,
// one restart.
func TestRegistryRestartBetweenRunsWhileTheUnitIsDown(t *testing.T) {
	s := newStack(t, KindBuiltin)
	s.loopUnit(t, "registry", "vm-a", "t.tick", 5*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := Fault{Kind: FaultRegistryRestart, Unit: "registry"}
	for _, between := range []bool{true, false} {
		before, _ := s.sup.MainPID(ctx, "registry")
		hit, err := s.tr.WaitPoint(ctx, s.tr.Mark(), "t.tick", 1, "")
		if err != nil {
			t.Fatal(err)
		}
		calls, mainDuring := 0, -1
		var opts []ArmOption
		if between {
			opts = append(opts, Between(func(ctx context.Context) {
				calls++
				mainDuring, _ = s.sup.MainPID(ctx, "registry")
			}))
		}
		inj := s.inj.InjectHit(ctx, f, hit, opts...)
		if !inj.Landed || inj.Err != "" || inj.VictimPID != before {
			t.Fatalf("between=%v: %+v, want landed on main %d", between, inj, before)
		}
		if want := map[bool]int{true: 1, false: 0}[between]; calls != want || (between && mainDuring != 0) {
			t.Fatalf("between=%v: Between ran %d time(s) (want %d), main pid during it %d (want 0)", between, calls, want, mainDuring)
		}
		if now, _ := s.sup.MainPID(ctx, "registry"); now == 0 || now == before {
			t.Fatalf("between=%v: main %d after the restart, was %d", between, now, before)
		}
	}
}
