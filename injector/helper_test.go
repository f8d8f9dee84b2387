package injector

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/stackbin"
)

// The test binary doubles as the service under test: with
// VMCHAOS_INJECTOR_HELPER set it runs one of the helper modes below instead
// of the tests, so every supervised process is a real process.
const envHelper = "VMCHAOS_INJECTOR_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(envHelper); mode != "" {
		os.Exit(helperMain(mode))
	}
	code := m.Run()
	stackbin.Cleanup() // binaries stackbin built for this run
	os.Exit(code)
}

func helperLog(format string, a ...any) {
	p := os.Getenv("HELPER_SIGLOG")
	if p == "" {
		return
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	fmt.Fprintf(f, format+"\n", a...)
	f.Close()
}

func helperMain(mode string) int {
	switch mode {
	case "svc":
		// A service main process with one child, like nodeagent with an
		// in-flight vmctl child. Both log the SIGTERMs they get.
		// SIGTERM is caught before the log line the tests wait for: a stop
		// right after it must find the handler in place, not kill us silently.
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM)
		self, _ := os.Executable()
		// The child runs its main's argv, as a forked worker does: once
		// orphaned it must still not pass for the unit's main process.
		c := exec.Command(self, os.Args[1:]...)
		c.Env = append(os.Environ(), envHelper+"=child")
		if err := c.Start(); err != nil {
			return 2
		}
		helperLog("main %d started child %d", os.Getpid(), c.Process.Pid)
		<-ch
		helperLog("main %d got TERM", os.Getpid())
		return 0
	case "child":
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM)
		life, _ := time.ParseDuration(os.Getenv("HELPER_CHILD_LIFE"))
		if life > 0 {
			select {
			case <-ch:
			case <-time.After(life):
				return 0
			}
		} else {
			<-ch
		}
		helperLog("child %d got TERM", os.Getpid())
		return 0
	case "loop":
		// Hits a point in a loop: the victim of trigger tests and of the
		// accuracy benchmark. Honours VMCHAOS_FAILPOINTS (park).
		if err := failpoint.Init("helper"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		every, _ := time.ParseDuration(os.Getenv("HELPER_EVERY"))
		if every <= 0 {
			every = 5 * time.Millisecond
		}
		vm := os.Getenv("HELPER_VM")
		points := strings.Split(os.Getenv("HELPER_POINTS"), ",")
		// The in-victim benchmark arms against the main pid of the moment:
		// a pause before the first hit keeps that the process that hits.
		if d, err := time.ParseDuration(os.Getenv("HELPER_FIRST_HIT_AFTER")); err == nil {
			time.Sleep(d)
		}
		for i := 0; ; i++ {
			for _, p := range points {
				_ = failpoint.Hit(context.Background(), p, failpoint.Attrs{"vm": vm, "i": i})
			}
			time.Sleep(every)
		}
	case "daemonize":
		// Start a grandchild in its own session and exit: it is reparented
		// to whatever subreaper is above us.
		self, _ := os.Executable()
		c := &exec.Cmd{Path: self, Args: []string{os.Getenv("HELPER_ARGV0"), "--api-socket", "path=" + os.Getenv("HELPER_SOCK")},
			Env: append(os.Environ(), envHelper+"=child"), SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
		if err := c.Start(); err != nil {
			return 2
		}
		if err := os.WriteFile(os.Getenv("HELPER_PIDFILE"), []byte(strconv.Itoa(c.Process.Pid)), 0o644); err != nil {
			return 2
		}
		return 0
	case "runner":
		// A vmchaos runner: a supervisor with one unit, then it waits to be SIGKILLed.
		ctx := context.Background()
		sup, err := NewSupervisor(ctx, os.Getenv("HELPER_KIND"), os.Getenv("HELPER_STATE"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "runner:", err)
			return 2
		}
		self, _ := os.Executable()
		if err := sup.Start(ctx, UnitSpec{Name: "left", Argv: []string{self, "-test.run=^$"}, Env: []string{envHelper + "=svc"}, RestartSec: time.Second}); err != nil {
			fmt.Fprintln(os.Stderr, "runner:", err)
			return 2
		}
		// Wait for the main and the child it execs, by the child's own
		// environ: the unit also shows transient processes, such as the
		// clone(CLONE_PIDFD) probe Go's os package forks before the first
		// StartProcess (os/pidfd_linux.go checkClonePidfd), gone a moment later.
		var pids []string
		for pids == nil {
			procs, _ := sup.Procs(ctx, "left")
			for _, p := range procs[min(1, len(procs)):] {
				if environHas(p.PID, envHelper+"=child") {
					pids = []string{strconv.Itoa(procs[0].PID), strconv.Itoa(p.PID)}
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		// A test of doctor itself takes the watchdog away first, as if it
		// had died with the runner before it could act.
		if b, ok := sup.(*builtin); ok && os.Getenv("HELPER_KILL_WATCHDOG") != "" {
			_ = syscall.Kill(b.watch.pid, syscall.SIGKILL)
			<-b.watch.done
		}
		writeReady([]byte(strings.Join(pids, " ")))
		select {}
	case "reserve":
		// A runner SIGKILLed after it reserved its stack dir, before any
		// supervisor exists.
		dir, _, err := ReserveDir(os.Getenv("HELPER_TMP"), "vmchaos-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "reserve:", err)
			return 2
		}
		_ = os.WriteFile(filepath.Join(dir, "disk.img"), make([]byte, 4096), 0o644)
		// A command the runner runs itself (no unit, no run tag) that
		// names the dir, as a vmctl call names its root.
		c := exec.Command("/usr/bin/tail", "-f", filepath.Join(dir, "disk.img"))
		if err := c.Start(); err != nil {
			return 2
		}
		writeReady([]byte(dir + "\n" + strconv.Itoa(c.Process.Pid)))
		select {}
	case "hog":
		// The accuracy benchmark's loaded core: spin, bounded.
		d, err := time.ParseDuration(os.Getenv("HELPER_HOG_FOR"))
		if err != nil || d <= 0 {
			return 2
		}
		hog(d)
		return 0
	case "exec2":
		// An agent-like main process with two children of one kind: the
		// first parks at t.pending once the second's exec is in the trace,
		// as a save child parked while a restarted agent runs the next one.
		if err := failpoint.Init("nodeagent"); err != nil {
			return 2
		}
		self, _ := os.Executable()
		argv := []any{"vmctl", "snapshot", "save", "--name", "x", "vm1"}
		var pids []int
		for _, mode := range []string{"parkchild", "child"} {
			c := exec.Command(self, "snapshot", "save", "--name", "x", "vm1")
			c.Env = append(os.Environ(), envHelper+"="+mode, failpoint.EnvFailpoints+"=t.pending=pause")
			if err := c.Start(); err != nil {
				return 2
			}
			pids = append(pids, c.Process.Pid)
			_ = failpoint.Hit(context.Background(), "agent.child.exec", failpoint.Attrs{"vm": "vm1", "child_pid": c.Process.Pid, "argv": argv})
		}
		writeReady([]byte(fmt.Sprint(pids[1])))
		select {}
	case "parkchild":
		if err := failpoint.Init("vmctl"); err != nil {
			return 2
		}
		for {
			if _, err := os.Stat(os.Getenv("HELPER_READY")); err == nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		_ = failpoint.Hit(context.Background(), "t.pending", failpoint.Attrs{"vm": "vm1"})
		select {}
	case "exec":
		// An agent-like main process that runs one child and reports it
		// the way nodeagent does (agent.child.exec / agent.child.exit).
		if err := failpoint.Init("nodeagent"); err != nil {
			return 2
		}
		self, _ := os.Executable()
		for {
			c := exec.Command(self, "snapshot", "save", "--name", "x", "vm1")
			c.Env = append(os.Environ(), envHelper+"=child")
			if err := c.Start(); err != nil {
				return 2
			}
			argv := []any{"vmctl", "snapshot", "save", "--name", "x", "vm1"}
			_ = failpoint.Hit(context.Background(), "agent.child.exec", failpoint.Attrs{"vm": "vm1", "child_pid": c.Process.Pid, "argv": argv})
			err := c.Wait()
			_ = failpoint.Hit(context.Background(), "agent.child.exit", failpoint.Attrs{"vm": "vm1", "child_pid": c.Process.Pid, "argv": argv, "err": fmt.Sprint(err)})
			time.Sleep(10 * time.Millisecond)
		}
	}
	return 3
}

// helperArgv is the argv of a helper unit in mode.
func helperArgv(t testing.TB) []string {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{self, "-test.run=^$"}
}

// sigLog reads the helper's signal log.
func sigLog(t testing.TB, path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// waitFor polls cond until it holds or the (generous) timeout passes.
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startedChild parses "main M started child C" lines (pids as the helper saw them).
func startedChild(log string, main int) (int, bool) {
	for _, ln := range strings.Split(log, "\n") {
		var m, c int
		if _, err := fmt.Sscanf(ln, "main %d started child %d", &m, &c); err == nil && m == main {
			return c, true
		}
	}
	return 0, false
}

func itoa(n int) string { return strconv.Itoa(n) }

// writeReady publishes the helper's ready file whole: the test polls for
// the file's existence, so a plain WriteFile could be seen created but
// still empty (CI saw `runner reported ""`). A rename is atomic.
func writeReady(b []byte) {
	ready := os.Getenv("HELPER_READY")
	tmp := ready + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "helper: ready:", err)
		return
	}
	if err := os.Rename(tmp, ready); err != nil {
		fmt.Fprintln(os.Stderr, "helper: ready:", err)
	}
}
