// Package privatens runs a test binary again inside a private mount
// namespace, so the FUSE mounts its tests make never show in the host's
// mount table (tests of other packages that run at the same time compare
// it, and a mount namespace created elsewhere meanwhile would copy them).
package privatens

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
)

// Env marks the re-executed binary.
const Env = "VMCHAOS_PRIVATE_MOUNTNS"

// Reexec runs this binary again under `unshare --mount --propagation
// private` and returns its exit status with true; it returns false (run
// here) when already inside, when not root, or when unshare is missing.
func Reexec() (int, bool) {
	if os.Getenv(Env) != "" || os.Geteuid() != 0 {
		return 0, false
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return 0, false
	}
	cmd := exec.Command(unshare, append([]string{"--mount", "--propagation", "private", "--", os.Args[0]}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), Env+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, true
	case errors.As(err, &ee):
		return ee.ExitCode(), true
	default:
		return 0, false // unshare could not start: run here
	}
}
