package vmctl

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/chapi"
)

// TestLaunchEndsWhenTheVMMDiesBeforeItAnswers: a VMM that exits before its
// API answers ends launchVMM with that exit, not with the ready deadline
// (a start whose VMM was kill -9ed waited the full deadline before:
// mgr-start-vmm-kill9-at-ch.cli.start converged in 10.5 s).
func TestLaunchEndsWhenTheVMMDiesBeforeItAnswers(t *testing.T) {
	m := newTestManager(t)
	vmm := filepath.Join(t.TempDir(), "cloud-hypervisor")
	if err := os.WriteFile(vmm, []byte("#!/bin/sh\necho dying >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	m.chPath = vmm
	_, _, err := m.launchVMM(context.Background(), "ABCDEFGHIJKLMNOPQRSTUVWXYZ", nil)
	if err == nil || !strings.Contains(err.Error(), "exited before it answered: exit status 3") {
		t.Fatalf("launch of a VMM that exits 3: %v; want its exit named", err)
	}
}

// TestWaitStateEndsWhenTheVMMDies: the boot's wait for Running stops as
// soon as its VMM is gone (mgr-start-vmm-kill9-at-ch.cli.start: the VMM
// bound its socket, then was killed, and the wait ran to its deadline).
func TestWaitStateEndsWhenTheVMMDies(t *testing.T) {
	c := chapi.New(filepath.Join(t.TempDir(), "api.sock"))
	err := waitState(context.Background(), c, chapi.StateRunning, func() bool { return false })
	if err == nil || !strings.Contains(err.Error(), "the VMM died") {
		t.Fatalf("waitState with a dead VMM: %v", err)
	}
}
