package lazyfs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMountInShowsOneTreeInAnotherMountNamespace: a process in a private
// mount namespace created before the mount (the sandbox supervisor's
// units) sees the lazy filesystem through MountIn, writes through it reach
// the same tree, and after a power cut it sees the survivors, not the
// plain dir underneath.
func TestMountInShowsOneTreeInAnotherMountNamespace(t *testing.T) {
	if why := Available(); why != "" {
		t.Skip("missing host feature: " + why + ": run as root on a host with /dev/fuse (modprobe fuse)")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("missing binary: no unshare on PATH (" + err.Error() + "): install util-linux")
	}
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	other := exec.Command(unshare, "--mount", "--propagation", "private", "sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
	ns := "/proc/" + strconv.Itoa(other.Process.Pid) + "/ns/mnt"
	for self, _ := os.Readlink("/proc/self/ns/mnt"); ; time.Sleep(5 * time.Millisecond) {
		if l, _ := os.Readlink(ns); l != "" && l != self {
			break // unshare has entered its namespace
		}
	}
	m, err := MountIn(dir, NewTree(), []string{ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Unmount() })
	inside := func(script string) string {
		t.Helper()
		out, err := exec.Command("nsenter", "--target", strconv.Itoa(other.Process.Pid), "--mount", "sh", "-c", script).CombinedOutput()
		if err != nil {
			t.Fatalf("in the other namespace: %s: %v: %s", script, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	writeFile(t, filepath.Join(dir, "kept"), "kept", true)
	syncDir(t, dir)
	if got := inside("cat " + dir + "/kept"); got != "kept" {
		t.Fatalf("the other namespace reads %q, want the lazy file's contents", got)
	}
	inside("echo lost > " + dir + "/lost") // written there, never fsynced
	if _, err := os.Stat(filepath.Join(dir, "lost")); err != nil {
		t.Fatalf("a write in the other namespace did not reach the same tree: %v", err)
	}
	if m, err = m.PowerCut(); err != nil {
		t.Fatal(err)
	}
	if got := inside("ls " + dir); got != "kept" {
		t.Fatalf("after the cut the other namespace lists %q, want only the durable file", got)
	}
}
