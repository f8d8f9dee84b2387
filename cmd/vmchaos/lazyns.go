package main

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/lazyfs/privatens"
	"github.com/vmchaos/vmchaos/scenarios"
)

// inPrivateMountNS re-runs this command in a private mount namespace when
// its cases put stacks on lazy filesystems (power-cut cases, --lazyfs), and
// returns its exit status with true; false: run here. The runner's FUSE
// mounts then never show in the host's mount table (other runs and tests
// on the host compare it) and go with the namespace even if the runner is
// SIGKILLed. Not where the stack's units are the host systemd's (they live
// in the host's namespace), nor on the real backend (its network namespace
// is a mount under the host's /run/netns).
func inPrivateMountNS(f *runFlags, cases []scenarios.Case) (int, bool) {
	if os.Getenv(privatens.Env) != "" {
		dieWithOuterRun()
		return 0, false
	}
	if os.Geteuid() != 0 || f.backend != "fake" || !needsLazyfs(f, cases) {
		return 0, false
	}
	if f.supervisor == injector.KindSystemd || (f.supervisor == injector.KindAuto && pid1IsSystemd()) {
		return 0, false
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return 0, false
	}
	cmd := exec.Command(unshare, append([]string{"--mount", "--propagation", "private", "--", os.Args[0]}, os.Args[1:]...)...)
	// The run in the namespace dies with this one (dieWithOuterRun): a
	// SIGKILL here must not leave it running the catalogue on its own.
	pr, pw, err := os.Pipe()
	if err != nil {
		return 0, false
	}
	defer pw.Close()
	cmd.ExtraFiles = []*os.File{pr}
	cmd.Env = append(os.Environ(), privatens.Env+"=1", envOuterPipe+"=3")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// The run in the namespace tears its stacks down on SIGINT/SIGTERM:
	// forward them, never die first (a terminal's ^C reaches both).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	err = cmd.Start()
	pr.Close()
	if err != nil {
		return 0, false
	}
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, true
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		return ee.ExitCode(), true
	default:
		return 3, true // killed by a signal: an infrastructure error
	}
}

// envOuterPipe names the fd of the read end of a pipe whose write end only
// the outer run (the one that re-ran itself in a private mount namespace)
// holds.
const envOuterPipe = "VMCHAOS_OUTER_RUN_PIPE"

// dieWithOuterRun SIGKILLs this run once the outer run is gone (EOF on the
// pipe): a SIGKILLed outer run then leaves what any SIGKILLed run leaves
// (builtin units go with their watchdogs; doctor --clean removes the rest),
// not a live run of its own. Not Pdeathsig: it follows the forking thread.
func dieWithOuterRun() {
	fd, err := strconv.Atoi(os.Getenv(envOuterPipe))
	if err != nil || fd < 3 {
		return
	}
	syscall.CloseOnExec(fd) // the stack's processes must not hold it
	go func() {
		_, _ = io.Copy(io.Discard, os.NewFile(uintptr(fd), "outer-run"))
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}()
}

// needsLazyfs reports whether any case's stack goes on lazy filesystems.
func needsLazyfs(f *runFlags, cases []scenarios.Case) bool {
	if f.lazyfs {
		return true
	}
	for _, c := range cases {
		for _, fl := range c.Scenario.Faults {
			if fl.Kind == scenarios.FaultPowerCut {
				return true
			}
		}
	}
	return false
}

// pid1IsSystemd: auto would pick the host's systemd.
func pid1IsSystemd() bool {
	b, err := os.ReadFile("/proc/1/comm")
	return err == nil && strings.TrimSpace(string(b)) == "systemd"
}
