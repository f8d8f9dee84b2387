package injector

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// nsView is the pid of host pid h as the process itself sees it.
func nsView(h int) int {
	ns := nsPIDs(h)
	if len(ns) == 0 {
		return 0
	}
	return ns[len(ns)-1]
}

// newSup creates a supervisor of kind or skips with the reason it cannot run here.
func newSup(t *testing.T, kind string) Supervisor {
	t.Helper()
	t.Setenv(EnvRegistry, filepath.Join(t.TempDir(), "registry"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := NewSupervisor(ctx, kind, filepath.Join(t.TempDir(), "state"))
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("%s supervisor unavailable here: %v", kind, err)
	}
	if err != nil {
		t.Fatalf("new %s supervisor: %v", kind, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close %s supervisor: %v", kind, err)
		}
	})
	return s
}

// TestSupervisorContract runs the same systemd-semantics checks against every
// supervisor kind that works on this host (systemd skips unless PID 1 is systemd).
func TestSupervisorContract(t *testing.T) {
	for _, kind := range Kinds {
		t.Run(kind, func(t *testing.T) { contract(t, newSup(t, kind)) })
	}
}

// envInSandbox marks a test binary re-run inside a sandbox (below).
const envInSandbox = "VMCHAOS_TEST_IN_SANDBOX"

// TestSystemdSupervisorUnderSandboxPID1: this host's PID 1 is not systemd, so
// the systemd kind skips above. Inside a sandbox PID 1 is a real systemd, so
// the test binary re-runs its systemd contract there (nsenter into the
// sandbox's namespaces): the systemd supervisor's own code — system-bus
// connection, host cgroup paths, identity pid mapping — against a real
// systemd as PID 1. It must pass there, not skip.
func TestSystemdSupervisorUnderSandboxPID1(t *testing.T) {
	if os.Getenv(envInSandbox) != "" || systemdIsPID1() {
		t.Skip("already under a systemd PID 1: TestSupervisorContract/systemd runs directly")
	}
	sb := newSup(t, KindSandbox)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := Command(ctx, sb, os.Args[0], "-test.run", "^TestSupervisorContract$/^systemd$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), envInSandbox+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("systemd contract inside the sandbox: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--- PASS: TestSupervisorContract/systemd") {
		t.Fatalf("the systemd contract did not pass inside the sandbox (skipped?):\n%s", out)
	}
	t.Logf("inside the sandbox:\n%s", out)
}

func contract(t *testing.T, sup Supervisor) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir() // under /tmp: shared with a sandbox
	logp := filepath.Join(dir, "sig.log")
	const restartAfter = 300 * time.Millisecond
	spec := UnitSpec{Name: "contract", Argv: helperArgv(t), Env: []string{envHelper + "=svc", "HELPER_SIGLOG=" + logp},
		RestartSec: restartAfter, TimeoutStopSec: 5 * time.Second, LogPath: filepath.Join(dir, "unit.log")}
	if err := sup.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := sup.WaitActive(ctx, "contract"); err != nil {
		t.Fatal(err)
	}
	mainPID := func() int {
		t.Helper()
		p, err := sup.MainPID(ctx, "contract")
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// childOf returns the host pid of the child that main (host pid) started.
	childOf := func(main int) Proc {
		t.Helper()
		var c int
		waitFor(t, "the main process to log its child", 30*time.Second, func() bool {
			var ok bool
			c, ok = startedChild(sigLog(t, logp), nsView(main))
			return ok
		})
		h, err := sup.HostPID(ctx, c)
		if err != nil {
			ul, _ := os.ReadFile(spec.LogPath)
			t.Fatalf("child of main %d: %v\nsig.log:\n%s\nunit log:\n%s", main, err, sigLog(t, logp), ul)
		}
		p, err := Identify(h)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	termed := func(who string, pid int) bool {
		return strings.Contains(sigLog(t, logp), who+" "+itoa(pid)+" got TERM")
	}

	m1 := mainPID()
	n1 := nsView(m1)
	t.Run("MainPIDIsTheHostPID", func(t *testing.T) {
		if m1 <= 0 {
			t.Fatalf("MainPID = %d", m1)
		}
		// The log line first: it proves the new program runs. Right after
		// exec returns to the parent, the kernel may not yet have set the
		// new image's argv/env (/proc/pid/environ reads empty for a moment).
		if _, ok := startedChild(sigLog(t, logp), nsView(m1)); !ok {
			waitFor(t, "log line", 30*time.Second, func() bool { _, ok := startedChild(sigLog(t, logp), nsView(m1)); return ok })
		}
		if !environHas(m1, envHelper+"=svc") {
			t.Fatalf("host pid %d is not the unit's main process (cmdline %q)", m1, cmdline(m1))
		}
		if sup.Kind() == KindSandbox && len(nsPIDs(m1)) < 2 {
			t.Fatalf("sandbox main pid %d is not in a nested pid namespace: NSpid %v", m1, nsPIDs(m1))
		}
	})
	c1 := childOf(m1)

	t.Run("StopTermsMainOnlyChildrenSurvive", func(t *testing.T) {
		if err := sup.Stop(ctx, "contract"); err != nil {
			t.Fatal(err)
		}
		if !termed("main", n1) {
			// the log line was written by the dying process before it exited
			t.Fatalf("main %d got no SIGTERM; log:\n%s", m1, sigLog(t, logp))
		}
		if strings.Contains(sigLog(t, logp), "child") && strings.Contains(sigLog(t, logp), "got TERM") &&
			strings.Contains(sigLog(t, logp), "child "+itoa(nsView(c1.PID))+" got TERM") {
			t.Fatalf("stop signalled the child; log:\n%s", sigLog(t, logp))
		}
		if !c1.Alive() {
			t.Fatalf("child %d of the stopped main died (KillMode=process must leave it)", c1.PID)
		}
		time.Sleep(2 * restartAfter)
		if p := mainPID(); p != 0 {
			t.Fatalf("unit restarted after stop: main pid %d", p)
		}
		if err := sup.StartAgain(ctx, "contract"); err != nil {
			t.Fatal(err)
		}
		if err := sup.WaitActive(ctx, "contract"); err != nil {
			t.Fatal(err)
		}
	})

	var c2 Proc // the child of the main SIGKILLed below, orphaned
	t.Run("SigkillMainRestartsAfterRestartSec", func(t *testing.T) {
		m2 := mainPID()
		n2 := nsView(m2)
		c2 = childOf(m2)
		t0 := time.Now()
		if err := sup.KillMain(ctx, "contract", syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		var m3 int
		waitFor(t, "a restart", 30*time.Second, func() bool { m3 = mainPID(); return m3 != 0 && m3 != m2 })
		if el := time.Since(t0); el < restartAfter {
			t.Fatalf("restarted after %v, before RestartSec=%v", el, restartAfter)
		}
		if !c2.Alive() {
			t.Fatalf("child %d died with its SIGKILLed main", c2.PID)
		}
		if termed("main", n2) {
			t.Fatalf("SIGKILLed main logged a SIGTERM")
		}
	})

	// Orphans of earlier mains (c1, c2) run the unit's argv and are the
	// manager's children now: the main named from /proc must still be the
	// one the manager names, and none while there is none.
	if q, ok := sup.(quickMainer); ok {
		t.Run("QuickMainIsTheManagersMain", func(t *testing.T) {
			q.warmMain(ctx, "contract")
			// MainPID names the main at fork; /proc knows it by its argv
			// only once it has exec'd (c2, the orphan, runs that argv).
			execd := func(pid int) bool { return pid != 0 && slices.Equal(cmdline(pid), cmdline(c2.PID)) }
			var m int
			waitFor(t, "the main to run the unit's argv", 10*time.Second, func() bool { m = mainPID(); return execd(m) })
			if got := q.quickMainPID("contract"); got != m {
				t.Fatalf("quickMainPID = %d, MainPID = %d (orphans %d, %d: %q)", got, m, c1.PID, c2.PID, cmdline(c2.PID))
			}
			if !slices.Equal(cmdline(c2.PID), cmdline(m)) || !c2.Alive() {
				t.Fatalf("the orphan %d does not run the main's argv (%q vs %q): the check above proves nothing", c2.PID, cmdline(c2.PID), cmdline(m))
			}
			if err := sup.KillMain(ctx, "contract", syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			// RestartSec: no main until the manager starts one.
			waitFor(t, "the killed main to go", 10*time.Second, func() bool { st, err := readStat(m); return err != nil || st.state == 'Z' })
			if got := q.quickMainPID("contract"); got != 0 {
				t.Fatalf("quickMainPID = %d while the unit waits to restart (MainPID %d)", got, mainPID())
			}
			var m4 int
			waitFor(t, "a restart whose main runs the unit's argv", 30*time.Second, func() bool { m4 = mainPID(); return m4 != m && execd(m4) })
			if got := q.quickMainPID("contract"); got != m4 {
				t.Fatalf("after the restart quickMainPID = %d, MainPID = %d", got, m4)
			}
		})
	}

	t.Run("Restart", func(t *testing.T) {
		m3 := mainPID()
		c3 := childOf(m3)
		n3 := nsView(m3)
		if err := sup.Restart(ctx, "contract"); err != nil {
			t.Fatal(err)
		}
		if err := sup.WaitActive(ctx, "contract"); err != nil {
			t.Fatal(err)
		}
		m4 := mainPID()
		if m4 == m3 || m4 == 0 {
			t.Fatalf("main pid %d after restart (was %d)", m4, m3)
		}
		if !termed("main", n3) {
			t.Fatalf("restart did not SIGTERM main %d; log:\n%s", m3, sigLog(t, logp))
		}
		if !c3.Alive() {
			t.Fatalf("restart killed child %d (KillMode=process)", c3.PID)
		}
	})

	t.Run("KillAllKillsChildren", func(t *testing.T) {
		m := mainPID()
		childOf(m)
		procs, err := sup.Procs(ctx, "contract")
		if err != nil {
			t.Fatal(err)
		}
		// main + one child per incarnation so far (4), all left by KillMode=process
		if len(procs) < 5 || procs[0].PID != m {
			t.Fatalf("Procs = %v, want main %d first and ≥ 4 children", procs, m)
		}
		if err := sup.KillAll(ctx, "contract", syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for _, p := range procs {
			waitFor(t, "pid "+itoa(p.PID)+" to die", 30*time.Second, func() bool { return !p.Alive() })
		}
		waitFor(t, "restart after kill-all", 30*time.Second, func() bool { p := mainPID(); return p != 0 && p != m })
	})

	t.Run("RemoveLeavesNothing", func(t *testing.T) {
		procs, _ := sup.Procs(ctx, "contract")
		childOf(mainPID())
		if err := sup.Remove(ctx, "contract"); err != nil {
			t.Fatal(err)
		}
		for _, p := range procs {
			if p.Alive() {
				t.Fatalf("pid %d survived Remove", p.PID)
			}
		}
		if _, err := sup.MainPID(ctx, "contract"); !errors.Is(err, ErrUnknownUnit) {
			t.Fatalf("MainPID after Remove: %v, want ErrUnknownUnit", err)
		}
	})
}
