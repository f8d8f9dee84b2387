package vmctl

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/regress"
)

// park starts verb paused at point and returns its pid once parked.
func (s *stack) park(point string, env []string, args ...string) (int, func() result) {
	s.t.Helper()
	_ = os.Remove(filepath.Join(s.ctl, point+".release"))
	_ = os.Remove(filepath.Join(s.ctl, point+".paused"))
	p := s.background(append([]string{failpoint.EnvFailpoints + "=" + point + "=pause"}, env...), args...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pid, err := failpoint.WaitParked(ctx, s.ctl, point)
	if err != nil {
		s.t.Fatalf("%v: %v (stderr %s)", args, err, p.stderr.String())
	}
	if pid != p.cmd.Process.Pid {
		s.t.Fatalf("parked pid %d is not our child %d", pid, p.cmd.Process.Pid)
	}
	return pid, func() result { return p.wait(s.t) }
}

func (s *stack) release(point string) {
	s.t.Helper()
	if err := failpoint.Release(s.ctl, point); err != nil {
		s.t.Fatal(err)
	}
}

func (s *stack) staleCreate(ref string, env ...string) StaleCreateResult {
	s.t.Helper()
	r := s.runEnv(env, "vm", "reconcile-stale-create", ref, "-o", "json")
	if r.code != 0 {
		s.t.Fatalf("reconcile-stale-create %s: %s", ref, r)
	}
	var res StaleCreateResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		s.t.Fatalf("reconcile-stale-create output %q: %v", r.stdout, err)
	}
	return res
}

// TestReconcileStaleCreateOutcomes: busy while a clone is parked (and the
// clone then completes untouched), not-creating once it committed,
// not-found, and collected once the owner was SIGKILLed (no VMM survives).
func TestReconcileStaleCreateOutcomes(t *testing.T) {
	s := newStack(t, "0.02")
	s.runVM("a")
	s.ok("snapshot", "save", "--name", "base", "a")

	_, wait := s.park("vm.clone.files-copied", nil, "vm", "clone", "--name", "x", "base")
	x := findByName(s.list(), "x")
	if x == nil || x.State != StateCreating {
		t.Fatalf("parked clone's placeholder: %+v", x)
	}
	if res := s.staleCreate(x.ID); res.Outcome != OutcomeBusy || res.ID != x.ID {
		t.Fatalf("want busy, got %+v", res)
	}
	s.release("vm.clone.files-copied")
	if r := wait(); r.code != 0 {
		t.Fatalf("clone after busy: %s", r)
	}
	s.waitGuest("x")
	if res := s.staleCreate("x"); res.Outcome != OutcomeNotCreating {
		t.Fatalf("want not-creating, got %+v", res)
	}
	if res := s.staleCreate("AAAAAAAAAAAAAAAAAAAAAAAAAA"); res.Outcome != OutcomeNotFound {
		t.Fatalf("want not-found, got %+v", res)
	}
	if res := s.staleCreate("no-such-name"); res.Outcome != OutcomeNotFound {
		t.Fatalf("want not-found, got %+v", res)
	}

	// Owner killed after its VMM started: collected, VMM gone, name free.
	pid, wait := s.park("vm.clone.vmm-launched", nil, "vm", "clone", "--name", "y", "base")
	y := findByName(s.list(), "y")
	if len(s.m.findVMMs()[y.ID]) != 1 {
		t.Fatalf("parked clone should have a live VMM")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if r := wait(); r.signal != syscall.SIGKILL {
		t.Fatalf("clone not killed: %s", r)
	}
	if res := s.staleCreate(y.ID); res.Outcome != OutcomeCollected || res.ID != y.ID {
		t.Fatalf("want collected, got %+v", res)
	}
	if pids := s.m.findVMMs()[y.ID]; len(pids) != 0 {
		t.Fatalf("VMM of collected VM survived: %v", pids)
	}
	if findByName(s.list(), "y") != nil {
		t.Fatal("collected placeholder still listed")
	}
	s.check()
	s.ok("vm", "clone", "--name", "y", "base")
	s.check()
}

// TestStaleCreateBlockingLockRegression: with stale-create-blocking-lock the
// verb queues behind a live clone and then deletes the VM that clone just
// committed (seed 002); without it the same call answers busy at once.
func TestStaleCreateBlockingLockRegression(t *testing.T) {
	s := newStack(t, "0.02")
	s.runVM("a")
	s.ok("snapshot", "save", "--name", "base", "a")
	_, wait := s.park("vm.clone.files-copied", nil, "vm", "clone", "--name", "z", "base")
	z := findByName(s.list(), "z")
	bug := regress.Env + "=stale-create-blocking-lock"
	rc := s.background([]string{bug}, "vm", "reconcile-stale-create", z.ID, "-o", "json")
	s.release("vm.clone.files-copied")
	if r := wait(); r.code != 0 {
		t.Fatalf("clone: %s", r)
	}
	rr := rc.wait(t)
	var res StaleCreateResult
	if err := json.Unmarshal([]byte(rr.stdout), &res); err != nil {
		t.Fatalf("%s: %v", rr, err)
	}
	if res.Outcome != OutcomeCollected || findByName(s.list(), "z") != nil {
		t.Fatalf("with the bug the committed clone should be deleted: %+v, list %+v", res, s.list())
	}

	// Fixed: busy while parked, the clone survives.
	_, wait = s.park("vm.clone.files-copied", nil, "vm", "clone", "--name", "z", "base")
	z = findByName(s.list(), "z")
	if res := s.staleCreate(z.ID); res.Outcome != OutcomeBusy {
		t.Fatalf("fixed: want busy, got %+v", res)
	}
	s.release("vm.clone.files-copied")
	if r := wait(); r.code != 0 {
		t.Fatalf("clone: %s", r)
	}
	if v := findByName(s.list(), "z"); v == nil || v.State != StateRunning {
		t.Fatalf("fixed: clone should survive: %+v", v)
	}
	s.check()
}

var reservedRE = regexp.MustCompile(`clone ([A-Z2-7]{26}): reserved`)

// TestDaemonCollectsKilledCloneWithinTwoPasses is seed 002: a clone
// SIGKILLed just after its placeholder is written is collected by a running
// daemon within two passes.
func TestDaemonCollectsKilledCloneWithinTwoPasses(t *testing.T) {
	s := newStack(t, "0.05")
	s.runVM("a")
	s.ok("snapshot", "save", "--name", "base", "a")
	tr := newTrace(t)
	daemon := s.background([]string{tr.env()}, "daemon", "--interval", "1s")
	eventually(t, "first daemon pass", func() bool { return tr.count("daemon.pass") >= 1 })

	r := s.runEnv([]string{failpoint.EnvFailpoints + "=vm.clone.reserved=kill"}, "vm", "clone", "--name", "x", "base")
	if r.signal != syscall.SIGKILL {
		t.Fatalf("clone not killed: %s", r)
	}
	m := reservedRE.FindStringSubmatch(r.stderr)
	if m == nil {
		t.Fatalf("no reserved line: %s", r)
	}
	id := m[1]
	// Pass k+1 may have read the index before the placeholder existed; pass
	// k+2 started after the kill, so it must have collected it.
	k := tr.count("daemon.pass")
	eventually(t, "two daemon passes", func() bool { return tr.count("daemon.pass") >= k+2 })
	if findByName(s.list(), "x") != nil {
		t.Fatalf("placeholder %s survived two daemon passes", id)
	}
	if !strings.Contains(daemon.stderr.String(), "collected ownerless creating VM "+id) {
		t.Fatalf("daemon did not report the collect: %s", daemon.stderr.String())
	}
	// A second daemon is refused (single instance).
	s.fails("daemon already running", "daemon")
	s.check()
}

// TestEventStreamReportsKilledVMM is seed 000: `vm status --event` yields
// MODIFIED with "stopped (stale)" after the VMM is killed with -9; with
// event-stream-pointer-snapshot it never does, although `vm list` shows it.
func TestEventStreamReportsKilledVMM(t *testing.T) {
	for _, bug := range []bool{false, true} {
		t.Run(fmt.Sprintf("bug=%v", bug), func(t *testing.T) {
			s := newStack(t, "0.05")
			a := s.runVM("a")
			var env []string
			if bug {
				env = []string{regress.Env + "=event-stream-pointer-snapshot"}
			}
			cmd := s.command(env, "vm", "status", "--event", "--format", "json", "-n", "1")
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			lines := make(chan StatusEvent, 16)
			go func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					var e StatusEvent
					if json.Unmarshal(sc.Bytes(), &e) == nil {
						lines <- e
					}
				}
				close(lines)
			}()
			if e := <-lines; e.Event != EventAdded || e.VM.ID != a.ID || e.VM.State != StateRunning {
				t.Fatalf("first event: %+v", e)
			}
			if err := syscall.Kill(a.Pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			eventually(t, "list to show stale", func() bool { return s.list()[0].State == StateStale })
			if !bug {
				select {
				case e := <-lines:
					if e.Event != EventModified || e.VM.ID != a.ID || e.VM.State != StateStale {
						t.Fatalf("want MODIFIED stopped (stale), got %+v", e)
					}
				case <-time.After(60 * time.Second):
					t.Fatal("no MODIFIED event")
				}
				return
			}
			// 20 intervals without the event (50 ms each at this scale).
			select {
			case e := <-lines:
				t.Fatalf("with the bug no event was expected, got %+v", e)
			case <-time.After(time.Second):
			}
		})
	}
}

// TestSaveNameCollisions: a finalized holder and a pending holder give the
// two exact messages; the pending one is rejected before any capture, even
// when the capture would take 10 s; snapshot rm <ID> frees the name unless
// the lease is held, and succeeds once the holder is gone.
func TestSaveNameCollisions(t *testing.T) {
	s := newStack(t, "0.05")
	s.runVM("a")
	tr := newTrace(t)
	var fin Snapshot
	json.Unmarshal([]byte(s.ok("snapshot", "save", "--name", "s", "a", "-o", "json")), &fin)
	s.fails(fmt.Sprintf(MsgSnapNameExists, "s", fin.ID), "snapshot", "save", "--name", "s", "a")

	// A save SIGKILLed after its pending insert leaves a pending holder.
	r := s.runEnv([]string{failpoint.EnvFailpoints + "=snapshot.save.pending=kill"}, "snapshot", "save", "--name", "p", "a")
	if r.signal != syscall.SIGKILL {
		t.Fatalf("save not killed: %s", r)
	}
	var pend *Snapshot
	for _, sn := range s.snaps() {
		if sn.Name == "p" {
			pend = &sn
		}
	}
	if pend == nil || pend.State != SnapPending {
		t.Fatalf("no pending holder: %+v", s.snaps())
	}

	// VM b's capture takes 10 s (200 s × scale 0.05).
	id := strings.TrimSpace(s.runEnv([]string{`FAKECH_TIMING={"snapshot_fixed":"200s"}`}, "vm", "run", "--name", "b", s.image).stdout)
	s.waitGuest(id)
	start := time.Now()
	r = s.runEnv([]string{tr.env()}, "snapshot", "save", "--name", "p", "b")
	elapsed := time.Since(start)
	want := fmt.Sprintf(MsgSnapNameInUse, "p", pend.ID)
	if r.code != 1 || !strings.Contains(r.stderr, want) {
		t.Fatalf("want %q, got %s", want, r)
	}
	if n := tr.count("snapshot.save.locked") + tr.count("ch.pause"); n != 0 {
		t.Fatalf("rejected save reached the lock/pause (%d events)", n)
	}
	if elapsed > 5*time.Second {
		t.Fatalf("pending holder rejected after %s; must not wait for the 10 s capture", elapsed)
	}
	t.Logf("pending holder rejected in %s (capture would take 10 s)", elapsed)

	// With save-preflight-ignores-pending the clash surfaces only after a
	// full capture, as "already in use by".
	r = s.runEnv([]string{tr.env(), regress.Env + "=save-preflight-ignores-pending"}, "snapshot", "save", "--name", "p", "a")
	if r.code != 1 || !strings.Contains(r.stderr, want) {
		t.Fatalf("bug: want %q, got %s", want, r)
	}
	if tr.count("snapshot.save.captured") != 1 {
		t.Fatalf("bug: the capture should have run before the rejection")
	}

	// A live holder (save parked after its pending insert) holds the lease.
	pid, wait := s.park("snapshot.save.pending", nil, "snapshot", "save", "--name", "q", "a")
	var q *Snapshot
	for _, sn := range s.snaps() {
		if sn.Name == "q" {
			q = &sn
		}
	}
	s.fails("rm: "+fmt.Sprintf(MsgSnapInUse, q.ID), "snapshot", "rm", q.ID)
	syscall.Kill(pid, syscall.SIGKILL)
	wait()
	s.ok("snapshot", "rm", q.ID)
	s.ok("snapshot", "rm", pend.ID)
	s.ok("snapshot", "save", "--name", "p", "a")
	s.ok("snapshot", "save", "--name", "q", "a")
	s.check()
}

// TestVerbsConvergeOrphanedPause is seed 001 #2: a save killed while the VMM
// is paused leaves it Paused under a running record. vm net and vm start
// (holding the ops lock) and vm exec (finding it free) resume it: every pause
// window runs under that lock, so the pause's owner is dead. With
// net-refuses-paused nothing converges it and net answers the §4.5 message.
func TestVerbsConvergeOrphanedPause(t *testing.T) {
	s := newStack(t, "0.02")
	s.runVM("a")
	orphanPause := func() {
		t.Helper()
		r := s.runEnv([]string{failpoint.EnvFailpoints + "=snapshot.save.paused=kill"}, "snapshot", "save", "--name", "h", "a")
		if r.signal != syscall.SIGKILL {
			t.Fatalf("save not killed: %s", r)
		}
		if v := s.vm("a"); v.State != StateRunning || v.VMMState != "Paused" {
			t.Fatalf("want record running with VMM Paused, got %+v", v)
		}
	}
	orphanPause()
	bug := []string{regress.Env + "=net-refuses-paused"}
	for _, verb := range [][]string{{"vm", "net", "a", "--nics", "0"}, {"vm", "exec", "a", "--", "hostname"}, {"vm", "start", "a"}} {
		r := s.runEnv(bug, verb...)
		if r.code != 1 || !strings.Contains(r.stderr, MsgVMPaused) {
			t.Fatalf("bug: %v: want %q, got %s", verb, MsgVMPaused, r)
		}
	}
	if r := s.runEnv(bug, "vm", "net", "a", "--nics", "0"); strings.TrimSpace(r.stderr) != "Error: "+MsgVMPaused {
		t.Fatalf("bug: net must answer exactly %q: %s", MsgVMPaused, r)
	}
	if v := s.vm("a"); v.VMMState != "Paused" {
		t.Fatalf("bug: VMM should stay paused: %+v", v)
	}

	s.ok("vm", "net", "a", "--nics", "0")
	if v := s.vm("a"); v.VMMState != "Running" || len(v.Network) != 0 {
		t.Fatalf("net: %+v", v)
	}
	s.ok("vm", "net", "a", "--nics", "1")
	s.waitGuest("a")

	orphanPause()
	if out := s.ok("vm", "exec", "a", "--", "hostname"); strings.TrimSpace(out) == "" {
		t.Fatal("exec after converging printed nothing")
	}
	if v := s.vm("a"); v.VMMState != "Running" {
		t.Fatalf("exec: %+v", v)
	}

	orphanPause()
	s.ok("vm", "start", "a")
	if v := s.vm("a"); v.VMMState != "Running" {
		t.Fatalf("start: %+v", v)
	}
	s.ok("gc")
	s.check()
}

// TestRmFinishesAnInterruptedDelete: rm of a VM (or snapshot) whose rm died
// after the tombstone completes that delete itself, by id or by name.
func TestRmFinishesAnInterruptedDelete(t *testing.T) {
	s := newStack(t, "0.02")
	a := s.runVM("a")
	s.ok("snapshot", "save", "--name", "base", "a")
	kill := func(point string, args ...string) {
		t.Helper()
		if r := s.runEnv([]string{failpoint.EnvFailpoints + "=" + point + "=kill"}, args...); r.signal != syscall.SIGKILL {
			t.Fatalf("%v not killed: %s", args, r)
		}
	}
	kill("vm.rm.tombstoned", "vm", "rm", "--force", "a")
	if len(s.m.findVMMs()[a.ID]) != 1 {
		t.Fatal("the VMM should outlive the tombstone")
	}
	s.ok("vm", "rm", "--force", "a")
	if len(s.m.findVMMs()[a.ID]) != 0 {
		t.Fatal("rm by name did not finish the delete")
	}
	s.fails(MsgVMNotFound, "vm", "rm", "a")

	// By id, the way the node agent resumes a delete of its bound VM.
	b := s.runVM("b")
	kill("vm.rm.tombstoned", "vm", "rm", "--force", b.ID)
	s.ok("vm", "rm", "--force", b.ID)
	if len(s.m.findVMMs()[b.ID]) != 0 {
		t.Fatal("rm by id did not finish the delete")
	}
	s.fails(MsgVMNotFound, "vm", "rm", "--force", b.ID)

	// Two interrupted deletes of one name (two incarnations): rm by name
	// finishes both.
	c1 := s.runVM("c")
	kill("vm.rm.tombstoned", "vm", "rm", "--force", "c")
	c2 := s.runVM("c")
	kill("vm.rm.tombstoned", "vm", "rm", "--force", "c")
	s.ok("vm", "rm", "--force", "c")
	if vmms := s.m.findVMMs(); len(vmms[c1.ID])+len(vmms[c2.ID]) != 0 {
		t.Fatal("rm by name left an interrupted delete of an older incarnation")
	}
	s.check()
	s.fails(MsgVMNotFound, "vm", "rm", "c")

	kill("snapshot.rm.tombstoned", "snapshot", "rm", "base")
	s.ok("snapshot", "rm", "base")
	s.fails(MsgSnapshotNotFound, "snapshot", "rm", "base")
	s.check()
}

// TestOrphanDiesOnItsNextWriteToADeadPipe: Go's default SIGPIPE behaviour is
// kept. A save whose parent died (its stderr pipe has no reader) runs on
// until its next progress line and dies there with SIGPIPE — here right
// after the pause, leaving the VMM Paused, which vm net then converges
// (seed 001, method note and #2).
func TestOrphanDiesOnItsNextWriteToADeadPipe(t *testing.T) {
	s := newStack(t, "0.02")
	s.runVM("a")
	const point = "snapshot.save.locked"
	os.Remove(filepath.Join(s.ctl, point+".release"))
	cmd := s.command([]string{failpoint.EnvFailpoints + "=" + point + "=pause"}, "snapshot", "save", "--name", "o", "a")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := failpoint.WaitParked(ctx, s.ctl, point); err != nil {
		t.Fatal(err)
	}
	r.Close() // the parent is gone: nobody reads the pipe any more
	s.release(point)
	var werr error
	select {
	case werr = <-done:
		done <- werr
	case <-time.After(time.Minute):
		t.Fatal("orphaned save did not die")
	}
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGPIPE {
		t.Fatalf("want death by SIGPIPE, got %v", werr)
	}
	if v := s.vm("a"); v.VMMState != "Paused" {
		t.Fatalf("the pause line was the fatal write, so the VMM should be left Paused: %+v", v)
	}
	s.ok("vm", "net", "a", "--nics", "1")
	s.ok("gc")
	s.check()
}
