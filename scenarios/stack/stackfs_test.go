package stack_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/scenarios/stack"
	"github.com/vmchaos/vmchaos/stackbin"
)

// TestRunStackFS: --stack-fs tmpfs puts the run's dir on a tmpfs of its
// own, where a case stack's agent starts and answers; Close unmounts it and
// removes the dir. disk leaves the dir on the temp dir's filesystem, and
// an unknown value is refused before anything is created (issue 37).
func TestRunStackFS(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds runs with real processes")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounting the run's tmpfs")
	}
	bin, err := stackbin.Dir()
	if err != nil {
		t.Fatalf("stack binaries: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if _, err := stack.NewRun(ctx, stack.RunOptions{BinDir: bin, Supervisor: injector.KindBuiltin, StackFS: "ramdisk"}); err == nil || !strings.Contains(err.Error(), "want auto, tmpfs or disk") {
		t.Errorf("--stack-fs ramdisk: %v, want a refusal", err)
	}

	for _, tc := range []struct {
		fs    string
		tmpfs bool
	}{{stack.StackFSTmpfs, true}, {stack.StackFSDisk, false}} {
		run, err := stack.NewRun(ctx, stack.RunOptions{BinDir: bin, Supervisor: injector.KindBuiltin, Scale: 0.1, Seed: 1, StackFS: tc.fs})
		if err != nil {
			t.Fatalf("%s: %v", tc.fs, err)
		}
		var st unix.Statfs_t
		if err := unix.Statfs(run.TmpDir, &st); err != nil {
			t.Fatal(err)
		}
		if got := st.Type == unix.TMPFS_MAGIC; got != tc.tmpfs || run.TmpFS != tc.tmpfs {
			t.Errorf("%s: run dir %s on tmpfs: %v (Run.TmpFS %v), want %v", tc.fs, run.TmpDir, got, run.TmpFS, tc.tmpfs)
		}
		s, err := run.New(ctx, stack.Options{CaseDir: t.TempDir(), RestartDelay: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.StartAgent(ctx); err != nil {
			t.Fatalf("%s: agent: %v", tc.fs, err)
		}
		if _, err := s.Agent.List(ctx); err != nil {
			t.Errorf("%s: agent on the run's dir does not answer: %v", tc.fs, err)
		}
		if err := s.Close(ctx); err != nil {
			t.Errorf("%s: stack close: %v", tc.fs, err)
		}
		if err := run.Close(); err != nil {
			t.Errorf("%s: run close: %v", tc.fs, err)
		}
		if _, err := os.Stat(run.TmpDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: run dir %s left after Close: %v", tc.fs, run.TmpDir, err)
		}
		if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), " "+run.TmpDir+" ") {
			t.Errorf("%s: %s still mounted after Close", tc.fs, run.TmpDir)
		}
	}
}
