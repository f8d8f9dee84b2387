package main

import (
	"errors"
	"os"
	"os/exec"
	"os/signal"
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
	if os.Getenv(privatens.Env) != "" || os.Geteuid() != 0 || f.backend != "fake" || !needsLazyfs(f, cases) {
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
	cmd.Env = append(os.Environ(), privatens.Env+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// The run in the namespace tears its stacks down on SIGINT/SIGTERM:
	// forward them, never die first (a terminal's ^C reaches both).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
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
