package failpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/internal/rt"
)

// receiver is the harness end of VMCHAOS_TRACE.
type receiver struct {
	path string
	conn *net.UnixConn
	mu   sync.Mutex
	got  [][]byte
	wake chan struct{}
}

func newReceiver(t testing.TB) *receiver {
	t.Helper()
	dir, err := os.MkdirTemp("", "fptr")
	if err != nil {
		t.Fatal(err)
	}
	r := &receiver{path: filepath.Join(dir, "trace.sock"), wake: make(chan struct{}, 1)}
	r.conn, err = net.ListenUnixgram("unixgram", &net.UnixAddr{Name: r.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := r.conn.Read(buf)
			if err != nil {
				return
			}
			r.mu.Lock()
			r.got = append(r.got, append([]byte(nil), buf[:n]...))
			r.mu.Unlock()
			select {
			case r.wake <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		r.conn.Close()
		<-done
		os.RemoveAll(dir)
	})
	return r
}

// next waits for the i-th datagram (0-based).
func (r *receiver) next(t testing.TB, i int) Event {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		r.mu.Lock()
		if len(r.got) > i {
			b := r.got[i]
			r.mu.Unlock()
			ev, err := ParseEvent(b)
			if err != nil {
				t.Fatalf("datagram %s: %v", b, err)
			}
			return ev
		}
		r.mu.Unlock()
		select {
		case <-r.wake:
		case <-time.After(5 * time.Millisecond):
		case <-deadline:
			t.Fatalf("no datagram #%d", i)
		}
	}
}

func configure(t *testing.T, trace, spec, ctl string) {
	t.Helper()
	if err := Configure("testproc", trace, spec, ctl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(Reset)
}

func TestDisabledHitDoesNothing(t *testing.T) {
	Reset()
	if Enabled() {
		t.Fatal("enabled after Reset")
	}
	if err := Hit(context.Background(), "x", Attrs{"vm": "a"}); err != nil {
		t.Fatal(err)
	}
	configure(t, "", "", "")
	if Enabled() {
		t.Fatal("an empty configuration must stay disabled (one atomic load per hit)")
	}
}

func TestTraceDatagram(t *testing.T) {
	r := newReceiver(t)
	configure(t, r.path, "", "")
	before := Now()
	ctx := WithOp(context.Background(), "op-7")
	if err := Hit(ctx, "snapshot.save.paused", Attrs{"vm": "VM1", "child_pid": 42}); err != nil {
		t.Fatal(err)
	}
	after := Now()
	ev := r.next(t, 0)
	if ev.Point != "snapshot.save.paused" || ev.Proc != "testproc" || ev.Pid != os.Getpid() || ev.VM != "VM1" || ev.Op != "op-7" {
		t.Fatalf("event %+v", ev)
	}
	if ev.TsNs < before || ev.TsNs > after {
		t.Fatalf("ts %d outside [%d, %d]: must be CLOCK_MONOTONIC at the hit", ev.TsNs, before, after)
	}
	if _, lifted := ev.Attrs["vm"]; lifted || ev.Attrs["child_pid"] != float64(42) {
		t.Fatalf("attrs %v: vm/op are lifted, the rest kept", ev.Attrs)
	}
	// An explicit op attr wins over the context's.
	_ = Hit(ctx, "p2", Attrs{"op": "explicit"})
	if ev := r.next(t, 1); ev.Op != "explicit" || len(ev.Attrs) != 0 {
		t.Fatalf("event %+v", ev)
	}
}

func TestMissingTraceSocketStillRunsActions(t *testing.T) {
	configure(t, filepath.Join(t.TempDir(), "absent.sock"), "p=error(boom)", "")
	if err := Hit(context.Background(), "p", nil); err == nil || err.Error() != "boom" {
		t.Fatalf("action must run without a harness: %v", err)
	}
}

func TestErrorCountAndVMFilter(t *testing.T) {
	configure(t, "", "a=2*error(nope);b=error(only-x)@vm=X;c=error()", "")
	ctx := context.Background()
	for i, want := range []string{"nope", "nope", ""} {
		err := Hit(ctx, "a", nil)
		if got := fmt.Sprint(err); (want == "" && err != nil) || (want != "" && got != want) {
			t.Fatalf("hit %d of a: %v, want %q", i+1, err, want)
		}
	}
	if err := Hit(ctx, "b", Attrs{"vm": "Y"}); err != nil {
		t.Fatalf("@vm=X fired for Y: %v", err)
	}
	if err := Hit(ctx, "b", Attrs{"vm": "X"}); err == nil || err.Error() != "only-x" {
		t.Fatalf("@vm=X for X: %v", err)
	}
	if err := Hit(ctx, "c", nil); err == nil || err.Error() != "failpoint c" {
		t.Fatalf("error() default message: %v", err)
	}
	if err := Hit(ctx, "unlisted", nil); err != nil {
		t.Fatal(err)
	}
}

func TestSleepAction(t *testing.T) {
	configure(t, "", "s=sleep(30)", "")
	t0 := time.Now()
	if err := Hit(context.Background(), "s", nil); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < 30*time.Millisecond {
		t.Fatalf("sleep(30) returned after %v", d)
	}
}

// parkInBackground arms a pause at vm.clone.reserved and hits it from a
// goroutine; res gets Hit's result once the park is released.
func parkInBackground(t *testing.T) (ctl string, res <-chan error) {
	ctl = t.TempDir()
	configure(t, "", "vm.clone.reserved=pause", ctl)
	done := make(chan error, 1)
	go func() { done <- Hit(context.Background(), "vm.clone.reserved", nil) }()
	return ctl, done
}

func TestPauseParksUntilReleased(t *testing.T) {
	ctl, res := parkInBackground(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pid, err := WaitParked(ctx, ctl, "vm.clone.reserved")
	if err != nil || pid != os.Getpid() {
		t.Fatalf("WaitParked: %d %v", pid, err)
	}
	select {
	case err := <-res:
		t.Fatalf("pause returned before release: %v", err)
	default:
	}
	if err := Release(ctl, "vm.clone.reserved"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("not released")
	}
}

func TestPauseEndsWithContext(t *testing.T) {
	configure(t, "", "p=pause", t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() { res <- Hit(ctx, "p", nil) }()
	cancel()
	if err := <-res; !errors.Is(err, ErrPauseCancelled) {
		t.Fatalf("cancelled pause: %v", err)
	}
}

func TestPauseNeedsControlDir(t *testing.T) {
	if err := Configure("x", "", "p=pause", ""); err == nil || !strings.Contains(err.Error(), EnvCtl) {
		t.Fatalf("pause without %s: %v", EnvCtl, err)
	}
}

func TestParseSpec(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want []*rule // point, action, arg, msg, limit, vm
	}{
		{"", nil},
		{" ; ", nil},
		{"a=pause", []*rule{{point: "a", action: actPause}}},
		{"a=kill; b=exit(3)", []*rule{{point: "a", action: actKill}, {point: "b", action: actExit, arg: 3}}},
		{"a=3*sleep(250)@vm=01ABC", []*rule{{point: "a", action: actSleep, arg: 250, limit: 3, vm: "01ABC"}}},
		{"a=error(bad thing)", []*rule{{point: "a", action: actError, msg: "bad thing"}}},
		{"a=1*kill@vm=V", []*rule{{point: "a", action: actKill, limit: 1, vm: "V"}}},
		{"a=error(x*y)", []*rule{{point: "a", action: actError, msg: "x*y"}}},
		{"a=2*error(p@vm=q)@vm=R", []*rule{{point: "a", action: actError, msg: "p@vm=q", limit: 2, vm: "R"}}},
		{"a=1*signal(KILL,59)@vm=V", []*rule{{point: "a", action: actSignal, limit: 1, vm: "V", sig: syscall.SIGKILL, delay: 59 * time.Millisecond}}},
		{"a=signal(SIGSTOP, 2950us)", []*rule{{point: "a", action: actSignal, sig: syscall.SIGSTOP, delay: 2950 * time.Microsecond}}},
		{"a=signal(TERM,0)", []*rule{{point: "a", action: actSignal, sig: syscall.SIGTERM}}},
		{"a=1*signal(KILL,59ms,once=ab_C-9)", []*rule{{point: "a", action: actSignal, limit: 1, sig: syscall.SIGKILL, delay: 59 * time.Millisecond, once: "ab_C-9"}}},
		{"a=kill(once=k1)@vm=V", []*rule{{point: "a", action: actKill, vm: "V", once: "k1"}}},
		{"a=exit(3,once=e1)", []*rule{{point: "a", action: actExit, arg: 3, once: "e1"}}},
		{"a=error(x, y,once=r1)", []*rule{{point: "a", action: actError, msg: "x, y", once: "r1"}}},
		{"a=error(once upon a time)", []*rule{{point: "a", action: actError, msg: "once upon a time"}}},
	} {
		got, err := ParseSpec(tc.spec)
		if err != nil {
			t.Fatalf("%q: %v", tc.spec, err)
		}
		if len(got) != len(tc.want) {
			t.Fatalf("%q: %d rules, want %d", tc.spec, len(got), len(tc.want))
		}
		for i, r := range got {
			w := tc.want[i]
			if r.point != w.point || r.action != w.action || r.arg != w.arg || r.msg != w.msg || r.limit != w.limit || r.vm != w.vm ||
				r.sig != w.sig || r.delay != w.delay || r.once != w.once {
				t.Errorf("%q rule %d: %+v, want %+v", tc.spec, i, r, w)
			}
		}
	}
	for _, bad := range []string{"a", "=pause", "a=", "a=jump", "a=sleep", "a=sleep(x)", "a=sleep(-1)", "a=exit(256)",
		"a=pause(1)", "a=kill()", "a=0*kill", "a=x*kill", "a=sleep(1", "a=kill@vm=", "a=+1*kill",
		"a=signal", "a=signal()", "a=signal(KILL)", "a=signal(NOPE,1)", "a=signal(KILL,-1ms)", "a=signal(KILL,25h)", "a=signal(KILL,x)", "a=signal(9,1)",
		"a=signal(KILL,1,once=)", "a=kill(once=)", "a=kill(once=a.b)", "a=exit(once=e)", "a=error(m,once=a/b)", "a=signal(KILL,1,once=a/b)", "a=signal(KILL,1,twice=a)", "a=signal(KILL,1,once=a.b)"} {
		if _, err := ParseSpec(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseEvent(t *testing.T) {
	ok := `{"ts_ns":5,"pid":9,"proc":"vmctl","point":"vm.rm.done","vm":"V","attrs":{"k":1}}`
	ev, err := ParseEvent([]byte(ok))
	if err != nil || ev.TsNs != 5 || ev.VM != "V" {
		t.Fatalf("%+v %v", ev, err)
	}
	for _, bad := range []string{`{}`, `{"ts_ns":5,"pid":9,"proc":"vmctl"}`, `{"ts_ns":0,"pid":9,"proc":"p","point":"x"}`, `[`, `{"ts_ns":"5"}`} {
		if _, err := ParseEvent([]byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestCatalogueIsConsistent(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range Catalogue {
		if seen[p.Name] {
			t.Errorf("duplicate point %s", p.Name)
		}
		seen[p.Name] = true
		switch p.Proc {
		case "vmctl", "nodeagent", "fakech", "vmchaos": // vmchaos: the runner's own phases (ledger)
		default:
			t.Errorf("%s: proc %q", p.Name, p.Proc)
		}
		if p.Happened == "" || p.NotYet == "" || p.Op == "" {
			t.Errorf("%s: incomplete entry %+v", p.Name, p)
		}
		if _, ok := Lookup(p.Name); !ok {
			t.Errorf("Lookup(%s) failed", p.Name)
		}
	}
	if len(Names()) != len(Catalogue) {
		t.Fatal("Names() and Catalogue disagree")
	}
	for _, n := range []string{"ch.boot", "ch.pause", "ch.resume", "ch.snapshot.begin", "ch.snapshot.memory-written", "ch.snapshot.done",
		"ch.restore.begin", "ch.restore.done", "ch.net.added", "ch.net.removed", "ch.shutdown"} {
		if !seen[n] {
			t.Errorf("catalogue lacks %s (docs/architecture.md §3)", n)
		}
	}
}

// TestExitAndKillActions runs a real child process (this test binary) whose
// hit exits or SIGKILLs it; the trace datagram must arrive before it dies,
// so the harness sees the phase the process died in.
func TestExitAndKillActions(t *testing.T) {
	if os.Getenv("FAILPOINT_CHILD") == "1" {
		if err := Init("child"); err != nil {
			os.Exit(100)
		}
		_ = Hit(context.Background(), "die.here", Attrs{"vm": "C"})
		if os.Getenv("FAILPOINT_CHILD_LINGER") == "1" {
			// signal(SIG,DELAY): the operation goes on until the signal.
			_ = Hit(context.Background(), "after.hit", nil)
			linger := time.Minute
			if ms, err := strconv.Atoi(os.Getenv("FAILPOINT_CHILD_LINGER_MS")); err == nil {
				linger = time.Duration(ms) * time.Millisecond
			}
			time.Sleep(linger)
		}
		os.Exit(0) // not reached when the action fires
	}
	for _, tc := range []struct {
		action string
		check  func(*os.ProcessState) bool
	}{
		{"exit(7)", func(s *os.ProcessState) bool { return s.ExitCode() == 7 }},
		{"kill", func(s *os.ProcessState) bool {
			ws, ok := s.Sys().(syscall.WaitStatus)
			return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
		}},
	} {
		t.Run(tc.action, func(t *testing.T) {
			r := newReceiver(t)
			cmd := exec.Command(os.Args[0], "-test.run=^TestExitAndKillActions$")
			cmd.Env = append(os.Environ(), "FAILPOINT_CHILD=1", EnvTrace+"="+r.path, EnvFailpoints+"=die.here="+tc.action)
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			out, _ := cmd.CombinedOutput()
			if !tc.check(cmd.ProcessState) {
				t.Fatalf("child state %v, output %s", cmd.ProcessState, out)
			}
			ev := r.next(t, 0)
			if ev.Point != "die.here" || ev.Proc != "child" || ev.Pid != cmd.ProcessState.Pid() || ev.VM != "C" {
				t.Fatalf("event %+v from pid %d", ev, cmd.ProcessState.Pid())
			}
		})
	}
}

func TestInitRejectsMalformedSpec(t *testing.T) {
	t.Setenv(EnvFailpoints, "x=explode")
	if err := Init("p"); err == nil {
		t.Fatal("a malformed spec must fail Init: the scenario asked for an action")
	}
}

// BenchmarkHitDisabled: Hit inlines to one atomic load. A plain b.N loop is
// used because b.Loop's own per-iteration cost (~5 ns here) would dominate;
// the atomic load cannot be optimised away.
func BenchmarkHitDisabled(b *testing.B) {
	Reset()
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		_ = Hit(ctx, "vm.clone.reserved", nil)
	}
}

// BenchmarkHitEnabledTrace: one datagram per hit to a live receiver.
func BenchmarkHitEnabledTrace(b *testing.B) {
	r := newReceiver(b)
	if err := Configure("bench", r.path, "", ""); err != nil {
		b.Fatal(err)
	}
	defer Reset()
	ctx := context.Background()
	attrs := Attrs{"vm": "01HZXBENCHVM0000000000000", "child_pid": 1234}
	for b.Loop() {
		_ = Hit(ctx, "snapshot.save.paused", attrs)
	}
}

func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{"a=pause", "a=3*sleep(250)@vm=X;b=kill", "x=exit(0); y=error(m@vm=z)", "a=error(()", "=", ";;a=1*", "p=sleep(99999999999999999999)",
		"a=1*signal(KILL,59)@vm=V", "a=signal(SIGSTOP,2950us)", "a=signal(KILL,4294967296)", "a=signal(,)", "a=signal(KILL,1ms,once=t)"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		rules, err := ParseSpec(s)
		if err != nil {
			return
		}
		for _, r := range rules {
			if r.point == "" || r.action == 0 || r.limit < 0 || r.arg < 0 || r.delay < 0 || r.delay > MaxSignalDelay {
				t.Fatalf("%q: invalid rule %+v", s, r)
			}
			if r.once != "" && !validToken(r.once) {
				t.Fatalf("%q: once token %q", s, r.once)
			}
			if r.action == actSignal && SignalName(r.sig) == "" {
				t.Fatalf("%q: signal action with signal %d", s, r.sig)
			}
		}
	})
}

func FuzzParseEvent(f *testing.F) {
	f.Add([]byte(`{"ts_ns":1,"pid":2,"proc":"fakech","point":"ch.boot","vm":"V","op":"o","attrs":{"a":[1,{"b":null}]}}`))
	f.Add([]byte(`{"ts_ns":1,"seq":18446744073709551615,"pid":2,"proc":"vmctl","point":"p"}`))
	f.Add([]byte(`{"ts_ns":-1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := ParseEvent(b)
		if err != nil {
			return
		}
		if ev.Point == "" || ev.Pid <= 0 || ev.TsNs <= 0 {
			t.Fatalf("accepted invalid event %+v", ev)
		}
		if _, err := json.Marshal(ev); err != nil {
			t.Fatal(err)
		}
	})
}

// TestParkedPointAnnouncesAgainWhenItsFileIsCleared: a harness arming a new
// park removes stale control files; a process that was already parked must
// re-announce itself, or the harness waits forever for a park that happened.
func TestParkedPointAnnouncesAgainWhenItsFileIsCleared(t *testing.T) {
	ctl, res := parkInBackground(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := WaitParked(ctx, ctl, "vm.clone.reserved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(ctl, "vm.clone.reserved.paused")); err != nil {
		t.Fatal(err)
	}
	if pid, err := WaitParked(ctx, ctl, "vm.clone.reserved"); err != nil || pid != os.Getpid() {
		t.Fatalf("parked point did not announce again: %d %v", pid, err)
	}
	if err := Release(ctl, "vm.clone.reserved"); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil {
		t.Fatal(err)
	}
}

// TestDatagramsAreNumberedFromOnePerConfiguration: seq counts every datagram
// of the process from 1, and a new configuration (a new trace) starts again.
func TestDatagramsAreNumberedFromOnePerConfiguration(t *testing.T) {
	r := newReceiver(t)
	configure(t, r.path, "", "")
	for i := 0; i < 3; i++ {
		_ = Hit(context.Background(), "p", nil)
	}
	for i := 0; i < 3; i++ {
		if ev := r.next(t, i); ev.Seq != uint64(i+1) {
			t.Fatalf("datagram %d: seq %d, want %d", i, ev.Seq, i+1)
		}
	}
	configure(t, r.path, "", "")
	_ = Hit(context.Background(), "p", nil)
	if ev := r.next(t, 3); ev.Seq != 1 {
		t.Fatalf("after Configure: seq %d, want 1", ev.Seq)
	}
}

// TestSignalActionKillsItselfAfterTheDelay: a real child whose hit arms
// signal(KILL,30ms) goes on past the hit, then dies of SIGKILL; its last
// datagram is SignalPoint, stamped no earlier than hit + 30ms, naming the
// arming hit by seq and how late it fired.
func TestSignalActionKillsItselfAfterTheDelay(t *testing.T) {
	r := newReceiver(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestExitAndKillActions$")
	cmd.Env = append(os.Environ(), "FAILPOINT_CHILD=1", "FAILPOINT_CHILD_LINGER=1", EnvTrace+"="+r.path,
		EnvFailpoints+"=die.here=1*signal(KILL,30ms)@vm=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	out, _ := cmd.CombinedOutput()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child state %v, output %s", cmd.ProcessState, out)
	}
	if time.Since(start) > 30*time.Second {
		t.Fatal("the child lived until its linger ended: the signal never came")
	}
	hit, next, fired := r.next(t, 0), r.next(t, 1), r.next(t, 2)
	if hit.Point != "die.here" || next.Point != "after.hit" || fired.Point != SignalPoint {
		t.Fatalf("datagrams %s, %s, %s: want die.here, after.hit, %s", hit.Point, next.Point, fired.Point, SignalPoint)
	}
	delay := int64(30 * time.Millisecond)
	if fired.TsNs < hit.TsNs+delay {
		t.Fatalf("fired %d ns after the hit, before its delay %d", fired.TsNs-hit.TsNs, delay)
	}
	a := fired.Attrs
	if a["point"] != "die.here" || a["signal"] != "KILL" || a["hit_seq"] != float64(hit.Seq) || a["delay_ns"] != float64(delay) ||
		a["late_ns"] != float64(fired.TsNs-hit.TsNs-delay) || fired.VM != "C" || fired.Pid != hit.Pid {
		t.Fatalf("fired %+v, hit %+v", fired, hit)
	}
	// The spin began at most spinFor before due, and before the fire; or
	// the host held the timer thread and the backup thread fired it.
	if a["backup"] == float64(1) {
		if _, ok := a["spin_ns"]; ok || a["late_ns"].(float64) < float64(backupLag) {
			t.Fatalf("fired by the backup thread %v late, spin_ns %v: want ≥ %v late, no spin", a["late_ns"], a["spin_ns"], backupLag)
		}
	} else if spin, ok := a["spin_ns"].(float64); !ok || spin > float64(spinFor) || spin < -a["late_ns"].(float64) {
		t.Fatalf("spin_ns %v: want when the spin began, at most %v before due and before the fire", a["spin_ns"], spinFor)
	}
}

// TestOnceTokenFiresInOneProcessOnly: a victim restarted with the same
// environment (`signal(KILL,30ms,once=T)`) must not kill itself again: the
// first incarnation claims the token and dies, later ones (run one after the
// other, as a supervisor restarts them, then four at once) go on past the
// delay and exit 0. Real processes; exactly one failpoint.signal datagram,
// carrying the token, from the claimant.
func TestOnceTokenFiresInOneProcessOnly(t *testing.T) {
	r := newReceiver(t)
	ctl := t.TempDir()
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestExitAndKillActions$")
		cmd.Env = append(os.Environ(), "FAILPOINT_CHILD=1", "FAILPOINT_CHILD_LINGER=1", "FAILPOINT_CHILD_LINGER_MS=300",
			EnvTrace+"="+r.path, EnvCtl+"="+ctl, EnvFailpoints+"=die.here=1*signal(KILL,30ms,once=tok-1)@vm=C")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	killed := func(cmd *exec.Cmd) bool {
		_ = cmd.Wait()
		ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
		return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
	}
	first := start()
	if !killed(first) {
		t.Fatalf("first incarnation: %v, want killed by its own SIGKILL", first.ProcessState)
	}
	b, err := os.ReadFile(OnceClaimFile(ctl, "tok-1"))
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(first.Process.Pid) {
		t.Fatalf("claim file %q, %v: want the first incarnation's pid %d", b, err, first.Process.Pid)
	}
	for i := 0; i < 2; i++ {
		if c := start(); killed(c) || c.ProcessState.ExitCode() != 0 {
			t.Fatalf("restart %d: %v, want exit 0 (the token was claimed)", i+1, c.ProcessState)
		}
	}
	var all []*exec.Cmd
	for i := 0; i < 4; i++ {
		all = append(all, start())
	}
	for i, c := range all {
		if killed(c) || c.ProcessState.ExitCode() != 0 {
			t.Fatalf("concurrent %d: %v, want exit 0", i, c.ProcessState)
		}
	}
	// 7 processes × 2 hits + 1 signal: every datagram is in by now (each
	// process wrote its own before exiting).
	var signals []Event
	for i := 0; i < 15; i++ {
		if ev := r.next(t, i); ev.Point == SignalPoint {
			signals = append(signals, ev)
		}
	}
	if len(signals) != 1 || signals[0].Pid != first.Process.Pid || signals[0].Attrs["once"] != "tok-1" {
		t.Fatalf("signal datagrams %+v: want one, from pid %d, once=tok-1", signals, first.Process.Pid)
	}
}

// TestOnceErrorFiresOnceAcrossConfigurations: an error(MSG,once=T) action
// fires in the first configuration (a process) that hits its point; a
// restarted process with the same spec and control dir goes on unharmed.
func TestOnceErrorFiresOnceAcrossConfigurations(t *testing.T) {
	ctl := t.TempDir()
	ctx := context.Background()
	for i, want := range []string{"blip", "", ""} {
		configure(t, "", "a=error(blip,once=err-1)", ctl)
		err := Hit(ctx, "a", nil)
		if got := fmt.Sprint(err); (want == "" && err != nil) || (want != "" && got != want) {
			t.Fatalf("incarnation %d: %v, want %q", i+1, err, want)
		}
	}
	if _, err := os.Stat(OnceClaimFile(ctl, "err-1")); err != nil {
		t.Fatalf("claim file: %v", err)
	}
}

// TestOnceTokenNeedsTheControlDir: the claim lives in the control dir; a
// configuration without one is refused rather than fired without the guard.
func TestOnceTokenNeedsTheControlDir(t *testing.T) {
	if err := Configure("p", "", "a=signal(KILL,1ms,once=x)", ""); err == nil || !strings.Contains(err.Error(), "once=") {
		t.Fatalf("Configure without a ctl dir: %v", err)
	}
	Reset()
}

// signalsFired arms n signal(USR1,DELAY) actions in this process (one per
// hit, hits 1 ms apart) and returns the SignalPoint datagrams, after waiting
// (a safety net) for n of them and a further 50 ms for any extra.
func signalsFired(t *testing.T, n int, delay time.Duration) []Event {
	t.Helper()
	got := make(chan os.Signal, n+8)
	signal.Notify(got, syscall.SIGUSR1)
	defer signal.Stop(got)
	r := newReceiver(t)
	configure(t, r.path, fmt.Sprintf("tick=signal(USR1,%s)", delay), "")
	for range n {
		_ = Hit(context.Background(), "tick", nil)
		time.Sleep(time.Millisecond)
	}
	var fired []Event
	i := 0
	for ; len(fired) < n; i++ {
		if ev := r.next(t, i); ev.Point == SignalPoint {
			fired = append(fired, ev)
		}
	}
	time.Sleep(50 * time.Millisecond)
	r.mu.Lock()
	rest := r.got[i:]
	r.mu.Unlock()
	for _, b := range rest {
		if ev, err := ParseEvent(b); err == nil && ev.Point == SignalPoint {
			fired = append(fired, ev)
		}
	}
	if len(got) == 0 {
		t.Fatal("no SIGUSR1 reached the process")
	}
	return fired
}

// TestTimerAndBackupFireEachSignalOnce: with the backup thread armed beside
// the timer thread, each of 50 signals is fired exactly once (one datagram
// per arming hit), whichever thread fired it.
func TestTimerAndBackupFireEachSignalOnce(t *testing.T) {
	const n = 50
	fired := signalsFired(t, n, 3*time.Millisecond)
	seen := map[float64]bool{}
	for _, ev := range fired {
		seq := ev.Attrs["hit_seq"].(float64)
		if seen[seq] {
			t.Fatalf("the signal armed by hit %v fired twice", seq)
		}
		seen[seq] = true
	}
	if len(fired) != n {
		t.Fatalf("%d signals fired for %d arming hits", len(fired), n)
	}
}

// TestBackupFiresWhatTheTimerCannot: the timer thread held at its due time
// (as a host that takes its vCPU holds it) does not keep the signal from
// firing: the backup thread, on the other CPU, fires it once, backupLag or
// more after due, marked "backup", and the timer thread then leaves it.
func TestBackupFiresWhatTheTimerCannot(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skipf("the backup thread runs with 2 or more CPUs; this process may use %d", runtime.NumCPU())
	}
	hold := func(p *pendingSignal) {
		for deadline := time.Now().Add(10 * time.Second); !p.claimed.Load() && time.Now().Before(deadline); {
			time.Sleep(50 * time.Microsecond)
		}
	}
	testHookTimerDue.Store(&hold)
	defer testHookTimerDue.Store(nil)
	const n = 5
	fired := signalsFired(t, n, 3*time.Millisecond)
	if len(fired) != n {
		t.Fatalf("%d signals fired for %d arming hits", len(fired), n)
	}
	for _, ev := range fired {
		a := ev.Attrs
		if a["backup"] != float64(1) || a["late_ns"].(float64) < float64(backupLag) || a["signal"] != "USR1" {
			t.Fatalf("fired %+v: want the backup thread's, ≥ %v late", a, backupLag)
		}
	}
}

// TestDelayZeroSignalFiresFromAFIFOThread: a DELAY 0 signal fires from the
// hitting thread, which is SCHED_FIFO from before the stamp until the kill,
// so that the node's other work cannot hold it in between; a signal that
// does not end the process leaves the thread as it was. VMCHAOS_INJECTOR_RT=0
// turns the raise off.
func TestDelayZeroSignalFiresFromAFIFOThread(t *testing.T) {
	runtime.LockOSThread() // Hit and the fire run on this thread
	defer runtime.UnlockOSThread()
	before, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	probe := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: rt.Priority}
	if err := unix.SchedSetAttr(0, &probe, 0); err != nil {
		t.Skipf("this process may not use SCHED_FIFO (%v): the raise needs root or CAP_SYS_NICE", err)
	}
	if err := unix.SchedSetAttr(0, before, 0); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rt         string
		wantPolicy uint32
	}{{"", unix.SCHED_FIFO}, {"0", before.Policy}} {
		t.Run("VMCHAOS_INJECTOR_RT="+tc.rt, func(t *testing.T) {
			t.Setenv("VMCHAOS_INJECTOR_RT", tc.rt)
			var policy atomic.Int64
			policy.Store(-1)
			hook := func() {
				if a, err := unix.SchedGetAttr(0, 0); err == nil {
					policy.Store(int64(a.Policy))
				}
			}
			testHookFire.Store(&hook)
			defer testHookFire.Store(nil)
			if fired := signalsFired(t, 1, 0); len(fired) != 1 {
				t.Fatalf("%d signals fired for 1 arming hit", len(fired))
			}
			if got := policy.Load(); got != int64(tc.wantPolicy) {
				t.Fatalf("the firing thread's policy was %d at the kill, want %d", got, tc.wantPolicy)
			}
			after, err := unix.SchedGetAttr(0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if after.Policy != before.Policy || after.Priority != before.Priority || after.Nice != before.Nice {
				t.Fatalf("after the hit the thread is %+v, want it as before %+v", after, before)
			}
		})
	}
}

// "P=1*sleep(0);P=pause" (the runner's spec for a park P#2): the first hit
// goes on through the spent-after-one pass-through, the second parks.
func TestPassThroughThenPauseParksTheSecondHit(t *testing.T) {
	ctl := t.TempDir()
	configure(t, "", "ch.resume=1*sleep(0);ch.resume=pause", ctl)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := Hit(ctx, "ch.resume", nil); err != nil {
		t.Fatalf("first hit: %v", err)
	}
	if _, err := os.Stat(filepath.Join(ctl, "ch.resume.paused")); !os.IsNotExist(err) {
		t.Fatalf("the first hit parked (%v)", err)
	}
	res := make(chan error, 1)
	go func() { res <- Hit(ctx, "ch.resume", nil) }()
	if pid, err := WaitParked(ctx, ctl, "ch.resume"); err != nil || pid != os.Getpid() {
		t.Fatalf("second hit not parked: %d %v", pid, err)
	}
	if err := Release(ctl, "ch.resume"); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil {
		t.Fatal(err)
	}
}
