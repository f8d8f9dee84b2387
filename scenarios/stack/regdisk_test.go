package stack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vmchaos/vmchaos/injector"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("not root: the registry's tmpfs cannot be mounted")
	}
}

// mountedAt reports whether dir is a mount point in this mount namespace.
func mountedAt(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, ln := range strings.Split(string(b), "\n") {
		if f := strings.Fields(ln); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// TestRegistryDiskFillsAndHeals: a filled registry disk refuses a write
// with ENOSPC (what the distribution server meets), reads still work, and
// the heal gives the room back and stamps when; Unmount leaves no mount.
func TestRegistryDiskFillsAndHeals(t *testing.T) {
	needRoot(t)
	dir := filepath.Join(t.TempDir(), "storage")
	d, err := mountRegistryDisk(dir, 4<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Unmount() })
	blob := make([]byte, 100<<10)
	if err := os.WriteFile(filepath.Join(dir, "before"), blob, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.Fill(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ns, err := d.Healed(); ns != 0 || err != nil {
		t.Errorf("full disk: Healed() = %d, %v; want 0, nil", ns, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "while-full"), blob, 0o644); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a write to the full disk: %v, want ENOSPC", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "before")); err != nil || len(b) != len(blob) {
		t.Errorf("a read of the full disk: %d bytes, %v", len(b), err)
	}
	if err := d.Heal(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ns, err := d.Healed(); ns == 0 || err != nil {
		t.Errorf("healed disk: Healed() = %d, %v; want a stamp", ns, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "after"), blob, 0o644); err != nil {
		t.Fatalf("a write after the heal: %v", err)
	}
	if err := d.Unmount(); err != nil {
		t.Fatal(err)
	}
	if mountedAt(t, dir) {
		t.Fatalf("%s still mounted after Unmount", dir)
	}
}

// envRegDiskChild makes the test binary the runner of
// TestRegistryDiskLeftByADeadRunIsCleaned: it records a run dir, mounts a
// registry disk below it, fills it and exits without tearing down, as a
// runner SIGKILLed mid-fault would.
const envRegDiskChild = "VMCHAOS_TEST_REGDISK_CHILD"

// TestRegistryDiskLeftByADeadRunIsCleaned: the registry's tmpfs of a run
// whose runner died is a leak the census counts, and `doctor --clean`
// (CleanAllLeftovers) unmounts it and removes its dir.
func TestRegistryDiskLeftByADeadRunIsCleaned(t *testing.T) {
	if parent := os.Getenv(envRegDiskChild); parent != "" {
		dir, _, err := injector.ReserveDir(parent, "vmchaos-")
		if err == nil {
			var d *RegistryDisk
			if d, err = mountRegistryDisk(filepath.Join(dir, "c1", "oci", "storage"), 1<<20, nil); err == nil {
				err = d.Fill(context.Background())
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Print(dir)
		os.Exit(0) // no release, no unmount: the runner is gone
	}
	needRoot(t)
	t.Setenv(injector.EnvRegistryIndex, t.TempDir())
	reg := filepath.Join(t.TempDir(), "registry")
	t.Setenv(injector.EnvRegistry, reg)
	tmp := t.TempDir()
	self, _ := os.Executable()
	cmd := exec.Command(self, "-test.run=^TestRegistryDiskLeftByADeadRunIsCleaned$")
	cmd.Env = append(os.Environ(), envRegDiskChild+"="+tmp)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("runner: %v", err)
	}
	runDir := string(out)
	storage := filepath.Join(runDir, "c1", "oci", "storage")
	t.Cleanup(func() { _ = syscall.Unmount(storage, syscall.MNT_DETACH) })
	if !mountedAt(t, storage) {
		t.Fatalf("the runner left no mount at %s", storage)
	}
	opts := injector.CensusOptions{Registry: reg, TempDirs: []string{tmp}}
	if c := injector.TakeCensus(opts); c.Mounts != 1 || c.TempDirs != 1 {
		t.Fatalf("census of the dead run's leftovers:\n%s", c.Table())
	}
	ls, err := injector.CleanAllLeftovers(context.Background(), reg)
	if err != nil || len(ls) != 1 {
		t.Fatalf("clean: %v %v", ls, err)
	}
	if mountedAt(t, storage) {
		t.Fatalf("%s still mounted after the clean", storage)
	}
	if c := injector.TakeCensus(opts); c.Mounts != 0 || c.TempDirs != 0 {
		t.Fatalf("census after the clean:\n%s", c.Table())
	}
}
