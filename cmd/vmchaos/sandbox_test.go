package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/internal/needs"
)

// TestSandboxRunsTheCommandUnderSystemdPID1: the command sees a real systemd
// as PID 1 and the working directory it was started in; its exit status is
// vmchaos's; the temp state dir is gone afterwards.
func TestSandboxRunsTheCommandUnderSystemdPID1(t *testing.T) {
	needs.Root(t, "the sandbox supervisor")
	if why := injector.SandboxPreflight(); why != "" {
		t.Skip("no sandbox here: " + why)
	}
	t.Setenv(injector.EnvRegistry, t.TempDir())
	t.Setenv("TMPDIR", t.TempDir())
	wd := t.TempDir()
	t.Chdir(wd)
	cmd := newSandboxCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--", "/bin/sh", "-c", `echo "pid1=$(cat /proc/1/comm) wd=$(pwd) state=$(systemctl is-system-running)"; exit 3`})
	err := cmd.Execute()
	if exitCode(err) != 3 {
		t.Fatalf("exit status %d (err %v), want the command's 3\n%s", exitCode(err), err, out.String())
	}
	if want := "pid1=systemd wd=" + wd + " state=running"; !strings.Contains(out.String(), want) {
		t.Fatalf("want %q in:\n%s", want, out.String())
	}
	if left, _ := os.ReadDir(os.Getenv("TMPDIR")); len(left) != 0 {
		t.Fatalf("the sandbox left %d entries in its temp dir", len(left))
	}
}

func TestSandboxNeedsACommand(t *testing.T) {
	cmd := newSandboxCmd()
	cmd.SetArgs(nil)
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "no command") {
		t.Fatalf("err = %v, want a 'no command' error", err)
	}
}
