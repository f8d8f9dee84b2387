package injector

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/failpoint"
)

// foreignProcess starts a process that does not descend from this one: a
// helper double-forks it while this process is briefly not a subreaper, so it
// is reparented above us. Its argv[0] looks like a VMM of vmID.
func foreignProcess(t *testing.T, vmID string) Proc {
	t.Helper()
	dir := t.TempDir()
	self, _ := os.Executable()
	ch := filepath.Join(dir, "cloud-hypervisor")
	if err := os.Symlink(self, ch); err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(dir, "pid")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "VMCHAOS_INJECTOR_") {
			env = append(env, kv)
		}
	}
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
	c := exec.Command(self)
	c.Env = append(env, envHelper+"=daemonize", "HELPER_ARGV0="+ch, "HELPER_PIDFILE="+pidFile, "HELPER_SOCK="+filepath.Join(dir, vmID, "api.sock"))
	out, err := c.CombinedOutput()
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	if err != nil {
		t.Fatalf("daemonize: %v %s", err, out)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	p, err := Identify(pid)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the foreign process to be reparented away", 10*time.Second, func() bool { return !descendsFrom(pid, os.Getpid()) })
	t.Cleanup(func() { _ = signalProc(p, syscall.SIGKILL) }) // we did start it
	return p
}

func TestForeignProcessIsNeverSignalled(t *testing.T) {
	s := newStack(t, KindBuiltin)
	s.loopUnit(t, "agent", "vm-f", "f.tick", 5*time.Millisecond)
	foreign := foreignProcess(t, "FOREIGNVM")
	if s.sup.Owns(foreign) {
		t.Fatalf("builtin supervisor claims foreign pid %d", foreign.PID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// A trace that names the foreign pid as an agent child.
	if err := failpoint.Configure("nodeagent", s.tr.Path(), "", ""); err != nil {
		t.Fatal(err)
	}
	_ = failpoint.Hit(ctx, "agent.child.exec", failpoint.Attrs{"vm": "vm-f", "child_pid": foreign.PID, "argv": []any{"vmctl", "vm", "clone"}})
	failpoint.Reset()
	waitFor(t, "the event", 10*time.Second, func() bool { return s.tr.Len() > 0 && len(s.tr.Since(0)) > 0 })
	if _, err := s.tr.WaitPoint(ctx, 0, "agent.child.exec", 1, "vm-f"); err != nil {
		t.Fatal(err)
	}

	for _, f := range []Fault{
		{Kind: FaultSigkillChild, Unit: "agent"},
		{Kind: FaultSigkillVMM, VM: "FOREIGNVM"},
	} {
		inj := s.inj.Inject(ctx, f)
		if inj.Landed || !strings.Contains(inj.Err, ErrNotOwned.Error()) {
			t.Fatalf("%s: landed=%v err=%q, want a refusal", f.Kind, inj.Landed, inj.Err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if !foreign.Alive() {
		t.Fatalf("foreign pid %d was signalled", foreign.PID)
	}
}

func TestReusedPIDIsNeverSignalled(t *testing.T) {
	self, _ := os.Executable()
	c := exec.Command(self)
	c.Env = append(os.Environ(), envHelper+"=child")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	live, err := Identify(c.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// The record of an earlier process that held this pid: same pid, an
	// earlier start time. It must never reach the process now holding it.
	stale := Proc{PID: live.PID, Start: live.Start - 1}
	if err := signalProc(stale, syscall.SIGKILL); !errors.Is(err, ErrGone) {
		t.Fatalf("signal through a stale identity: %v, want ErrGone", err)
	}
	if _, err := OpenPidFD(stale); !errors.Is(err, ErrGone) {
		t.Fatalf("pidfd for a stale identity: %v", err)
	}
	time.Sleep(20 * time.Millisecond)
	if !live.Alive() {
		t.Fatal("the process now holding the pid was signalled")
	}

	// A pidfd opened before the process died can never reach a successor.
	fd, err := OpenPidFD(live)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	_ = c.Process.Kill()
	_ = c.Wait() // reaped: the pid is free for reuse from here on
	if err := fd.Signal(syscall.SIGKILL); !errors.Is(err, ErrGone) {
		t.Fatalf("signal through the pidfd of a reaped process: %v, want ErrGone", err)
	}
}

// TestLeftoversOfSIGKILLedRunAreFoundAndCleaned: a runner SIGKILLed with
// units running leaves its record; the next run (and doctor) finds every
// process of it and cleans up.
func TestLeftoversOfSIGKILLedRunAreFoundAndCleaned(t *testing.T) {
	for _, kind := range []string{KindBuiltin, KindSandbox} {
		t.Run(kind, func(t *testing.T) {
			if kind == KindSandbox && SandboxPreflight() != "" {
				t.Skip(SandboxPreflight())
			}
			reg := filepath.Join(t.TempDir(), "registry")
			t.Setenv(EnvRegistry, reg)
			dir := t.TempDir()
			ready := filepath.Join(dir, "ready")
			self, _ := os.Executable()
			runner := exec.Command(self)
			runner.Env = append(os.Environ(), envHelper+"=runner", "HELPER_KIND="+kind, "HELPER_STATE="+filepath.Join(dir, "state"),
				"HELPER_READY="+ready, "HELPER_SIGLOG="+filepath.Join(dir, "sig.log"), "HELPER_KILL_WATCHDOG=1")
			runner.Stderr = os.Stderr
			if err := runner.Start(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the runner's unit", 60*time.Second, func() bool { _, err := os.Stat(ready); return err == nil })
			_ = runner.Process.Signal(syscall.SIGKILL)
			_ = runner.Wait()

			ls, err := FindLeftovers(reg)
			if err != nil {
				t.Fatal(err)
			}
			if len(ls) != 1 || len(ls[0].Procs) < 2 {
				t.Fatalf("leftovers = %v, want one run with its main and child", ls)
			}
			t.Logf("found: %s", ls[0])
			procs := ls[0].Procs
			cleaned, err := CleanLeftovers(context.Background(), reg)
			if err != nil || len(cleaned) != 1 {
				t.Fatalf("clean: %v %v", cleaned, err)
			}
			for _, p := range procs {
				if p.Alive() {
					t.Fatalf("pid %d survived the cleanup", p.PID)
				}
			}
			if ls, _ := FindLeftovers(reg); len(ls) != 0 {
				t.Fatalf("still listed after cleanup: %v", ls)
			}
			if ls[0].Cgroup != "" {
				if _, err := os.Stat(ls[0].Cgroup); err == nil {
					t.Fatalf("cgroup %s left", ls[0].Cgroup)
				}
			}
		})
	}
}

// TestRunInsideASandboxIsNotJudgedFromTheHost: a runner inside a sandbox
// (`vmchaos sandbox -- vmchaos run`) shares the host's registry, but its pid
// names some other process on the host. The host must not take that live run
// for a SIGKILLed one and kill its units; once the sandbox is torn down, the
// record made inside goes with it.
func TestRunInsideASandboxIsNotJudgedFromTheHost(t *testing.T) {
	sb := newSup(t, KindSandbox) // sets a private registry for this test
	reg := Registry()
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	self, _ := os.Executable()
	ctx, cancel := context.WithCancel(context.Background())
	runner := Command(ctx, sb, self)
	runner.Env = append(os.Environ(), envHelper+"=runner", "HELPER_KIND="+KindBuiltin, "HELPER_STATE="+filepath.Join(dir, "state"),
		"HELPER_READY="+ready, "HELPER_SIGLOG="+filepath.Join(dir, "sig.log"))
	runner.Stderr = os.Stderr
	if err := runner.Start(); err != nil {
		t.Fatal(err)
	}
	// Killing nsenter does not end the runner inside; the sandbox's teardown
	// (Cleanup from newSup, after this) does.
	defer func() { cancel(); _ = runner.Wait() }()
	waitFor(t, "the sandboxed runner's unit", 60*time.Second, func() bool { _, err := os.Stat(ready); return err == nil })

	records, _ := filepath.Glob(filepath.Join(reg, "*.json"))
	if len(records) != 2 { // the sandbox's own and the inner runner's
		t.Fatalf("registry holds %d records, want 2: %v", len(records), records)
	}
	var innerRec Record
	for _, f := range records {
		var r Record
		if b, err := os.ReadFile(f); err == nil && json.Unmarshal(b, &r) == nil && r.Kind == KindBuiltin {
			innerRec = r
		}
	}
	if innerRec.RunnerPidNS == "" || innerRec.RunnerPidNS == pidNS(os.Getpid()) {
		t.Fatalf("the inner runner's record has pid namespace %q, want the sandbox's", innerRec.RunnerPidNS)
	}
	var inner []Proc // its unit's main and child, carrying its run tag
	for _, pid := range allPIDs() {
		if environHas(pid, innerRec.Tag()) && pid != sb.(*dbusSup).rec.Init.PID {
			if p, err := Identify(pid); err == nil {
				inner = append(inner, p)
			}
		}
	}
	if len(inner) < 2 {
		t.Fatalf("found %d processes of the inner unit on the host, want its main and child", len(inner))
	}
	if ls, err := FindLeftovers(reg); err != nil || len(ls) != 0 {
		t.Fatalf("the host judged a live sandboxed run a leftover: %v %v", ls, err)
	}
	if cleaned, err := CleanLeftovers(context.Background(), reg); err != nil || len(cleaned) != 0 {
		t.Fatalf("clean: %v %v", cleaned, err)
	}
	for _, p := range inner {
		if !p.Alive() {
			t.Fatalf("pid %d of the live sandboxed run was killed", p.PID)
		}
	}

	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	if records, _ := filepath.Glob(filepath.Join(reg, "*.json")); len(records) != 0 {
		t.Fatalf("records left after the sandbox was torn down: %v", records)
	}
}
