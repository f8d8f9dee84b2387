package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmchaos/vmchaos/injector"
)

func init() { register(newSandboxCmd) }

// commandExit carries the sandboxed command's exit status out of main.
type commandExit int

func (c commandExit) Error() string { return fmt.Sprintf("command exited with status %d", int(c)) }
func (c commandExit) ExitCode() int { return int(c) }

func newSandboxCmd() *cobra.Command {
	var stateDir string
	c := &cobra.Command{
		Use:   "sandbox [--state-dir DIR] -- COMMAND [ARG...]",
		Short: "Run a command inside a private systemd (PID 1 of new namespaces), then tear it down",
		Long: `sandbox boots the sandbox supervisor's private systemd — PID 1 of new pid, mount, cgroup,
uts and ipc namespaces, with its own /run and /dev, an overlay over /etc and stub targets only, so
no host unit starts and the host is left as it was — runs COMMAND inside those namespaces (in the
current directory; the network, /tmp and /var are the host's), and tears everything down when the
command ends or on SIGINT/SIGTERM. Exit status: the command's.

Inside, PID 1 is a real systemd, so code that needs one works on a host or container whose PID 1
is not systemd: 'vmchaos run --supervisor systemd', systemctl, or the systemd supervisor's own
contract test. Needs root, cgroup2 and systemd installed ('vmchaos doctor' says what is missing).`,
		Example: `  vmchaos sandbox -- systemctl list-units --type=target
  vmchaos sandbox -- vmchaos run --supervisor systemd --label-filter speed:fast --time-scale 0.05`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("no command: give it after --, e.g. vmchaos sandbox -- systemctl is-system-running")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := signalContext()
			defer cancel()
			cwd, err := os.Getwd()
			if err != nil {
				return err
			}
			if stateDir == "" {
				if stateDir, err = os.MkdirTemp("", "vmchaos-sandbox-"); err != nil {
					return err
				}
				defer os.RemoveAll(stateDir)
			}
			t0 := time.Now()
			sup, err := injector.NewSupervisor(ctx, injector.KindSandbox, stateDir)
			if err != nil {
				return fmt.Errorf("start the sandbox: %w", err)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "sandbox: systemd up as PID 1 in %s (state %s)\n", time.Since(t0).Round(time.Millisecond), stateDir)
			// setns into the mount namespace moves the caller to its root:
			// env -C puts the command back in our working directory.
			c := injector.Command(ctx, sup, append([]string{"/usr/bin/env", "-C", cwd, "--"}, args...)...)
			c.Stdin, c.Stdout, c.Stderr = os.Stdin, cmd.OutOrStdout(), cmd.ErrOrStderr()
			runErr := c.Run()
			closeErr := sup.Close()
			if closeErr != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "sandbox: teardown: %v\n", closeErr)
			} else {
				fmt.Fprintln(cmd.ErrOrStderr(), "sandbox: torn down, nothing left")
			}
			var ee *exec.ExitError
			switch {
			case errors.As(runErr, &ee) && ee.ExitCode() > 0:
				return commandExit(ee.ExitCode())
			case runErr != nil && ctx.Err() != nil:
				return fmt.Errorf("interrupted: %w", context.Cause(ctx))
			case runErr != nil:
				return fmt.Errorf("run %q in the sandbox: %w", args[0], runErr)
			}
			return closeErr
		},
	}
	c.Flags().StringVar(&stateDir, "state-dir", "", "sandbox state (units, bus socket, systemd.log); default: a temp dir removed afterwards")
	return c
}
