package vmctl

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/stackbin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	stackbin.Cleanup()
	os.Exit(code)
}

// binExec runs the real vmctl binary on root/run.
func binExec(t *testing.T, root, run string) Exec {
	t.Helper()
	bin, err := stackbin.Path("vmctl")
	if err != nil {
		t.Fatalf("vmctl binary: %v", err)
	}
	return func(ctx context.Context, args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "VMCTL_ROOT_DIR="+root, "VMCTL_RUN_DIR="+run)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return out.Bytes(), fmt.Errorf("%w: %s", err, strings.TrimSpace(errb.String()))
		}
		return out.Bytes(), nil
	}
}

// TestRealVmctlVerbsDecode runs the observer against the real binary: an
// empty store reads empty and consistent; a leftover staging dir is a
// violation vmctl check reports (exit 1) and the observer returns as data; a
// corrupt index is an error from every list, never an empty list.
func TestRealVmctlVerbsDecode(t *testing.T) {
	root, run := t.TempDir(), t.TempDir()
	o := NewObserver(binExec(t, root, run), root, run)
	ctx := context.Background()
	vms, err := o.VMs(ctx)
	if err != nil || len(vms) != 0 {
		t.Fatalf("empty store: vms %v, %v", vms, err)
	}
	if ss, err := o.Snapshots(ctx); err != nil || len(ss) != 0 {
		t.Fatalf("empty store: snapshots %v, %v", ss, err)
	}
	rep, err := o.Check(ctx)
	if err != nil || !rep.OK {
		t.Fatalf("empty store: check %+v, %v", rep, err)
	}

	// a staging entry that is no build (vmctl keeps builds under snapshots/.staging)
	staging := filepath.Join(root, "snapshots", ".staging", "not-a-build")
	if err := os.MkdirAll(staging, 0o755); err != nil {
		t.Fatal(err)
	}
	rep, err = o.Check(ctx)
	if err != nil {
		t.Fatalf("check with a leftover staging dir: %v", err)
	}
	if rep.OK || len(rep.Of(manager.CheckLeftoverStaging)) == 0 {
		t.Fatalf("staging dir %s not reported: %+v", staging, rep)
	}

	if err := os.WriteFile(filepath.Join(root, "vms.json"), []byte(`{"vms":{`), 0o644); err != nil {
		t.Fatal(err)
	}
	if vms, err := o.VMs(ctx); err == nil {
		t.Fatalf("corrupt index: vms %v and no error", vms)
	}
	rep, err = o.Check(ctx)
	if err == nil && (rep.OK || len(rep.Of(manager.CheckStoreLoadable)) == 0) {
		t.Fatalf("corrupt index: check %+v", rep)
	}
}
