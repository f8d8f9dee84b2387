package injector

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A run without a supervisor is recorded like a supervised one: its record
// names its tag and dirs, a live runner's record is no leftover, Close
// removes it; a dir that is not the run's own is refused.
func TestRunRecordOfAnUnsupervisedRun(t *testing.T) {
	reg := t.TempDir()
	t.Setenv(EnvRegistry, reg)
	dir, err := os.MkdirTemp("", "vmchaos-rr-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if _, err := NewRunRecord(context.Background(), []string{"/tmp/not-ours"}); err == nil {
		t.Fatal("a dir not named vmchaos-* was recorded")
	}
	rr, err := NewRunRecord(context.Background(), []string{dir})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(rr.Tag(), EnvRunTag+"=") {
		t.Fatalf("tag %q", rr.Tag())
	}
	files, _ := filepath.Glob(filepath.Join(reg, "*.json"))
	if len(files) != 1 {
		t.Fatalf("records: %v", files)
	}
	b, _ := os.ReadFile(files[0])
	if !strings.Contains(string(b), dir) || !strings.Contains(string(b), KindUnsupervised) {
		t.Fatalf("record %s", b)
	}
	if l, err := FindLeftovers(reg); err != nil || len(l) != 0 {
		t.Fatalf("a live run's record taken for a leftover: %v %v", l, err)
	}
	rec := *rr.rec
	rr.Close()
	if files, _ := filepath.Glob(filepath.Join(reg, "*.json")); len(files) != 0 {
		t.Fatalf("record left after Close: %v", files)
	}

	// the same record with its runner dead: the next run kills what
	// carries its tag (a VMM a manager's verb left) and removes its dir
	rec.Runner = deadRunner(t)
	vmm := exec.Command("sleep", "30")
	vmm.Env = append(os.Environ(), rec.Tag())
	if err := vmm.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = vmm.Process.Kill(); _ = vmm.Wait() }()
	b, _ = json.Marshal(rec)
	if err := os.WriteFile(filepath.Join(reg, rec.RunID+".json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	ls, err := FindLeftovers(reg)
	if err != nil || len(ls) != 1 || len(ls[0].Procs) != 1 || ls[0].Procs[0].PID != vmm.Process.Pid {
		t.Fatalf("leftovers of a dead manager run: %v, %v", ls, err)
	}
	if _, err := CleanLeftovers(context.Background(), reg); err != nil {
		t.Fatal(err)
	}
	if err := vmm.Wait(); err == nil {
		t.Error("the tagged process was not killed")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("run dir %s still there (%v)", dir, err)
	}
}
