package managerlayer

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A process of a run whose runner died is killed by the next run; one of a
// run whose runner lives is left alone.
func TestCleanLeftoversKillsOnlyOrphanedRuns(t *testing.T) {
	start := func(runDir string) *exec.Cmd {
		t.Helper()
		cmd := exec.Command("sleep", "300")
		cmd.Env = []string{EnvCaseTag + "=" + filepath.Join(runDir, "m1")}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	orphanDir, err := os.MkdirTemp("", "vmchaos-mgr-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(orphanDir)
	// The dead runner: a process that has exited.
	gone := exec.Command("true")
	if err := gone.Start(); err != nil {
		t.Fatal(err)
	}
	pid := gone.Process.Pid
	if err := os.WriteFile(filepath.Join(orphanDir, ownerFile), []byte(`{"pid":`+itoa(pid)+`,"start":1,"pid_ns":"`+pidNS()+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_ = gone.Wait()
	orphan := start(orphanDir)

	liveDir, err := os.MkdirTemp("", "vmchaos-mgr-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(liveDir)
	if err := writeOwner(liveDir); err != nil {
		t.Fatal(err)
	}
	kept := start(liveDir)
	time.Sleep(50 * time.Millisecond) // let exec finish (environ is readable once sleep runs)

	killed, err := cleanLeftovers()
	if err != nil {
		t.Fatal(err)
	}
	if len(killed) != 1 || !strings.HasPrefix(killed[0], itoa(orphan.Process.Pid)+" ") {
		t.Fatalf("killed %q, want only pid %d", killed, orphan.Process.Pid)
	}
	if alive(orphan.Process.Pid) {
		t.Fatal("the orphaned run's process is alive")
	}
	if !alive(kept.Process.Pid) {
		t.Fatal("the live run's process was killed")
	}
	if _, err := os.Stat(orphanDir); !os.IsNotExist(err) {
		t.Fatalf("the orphaned run's dir is left: %v", err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
