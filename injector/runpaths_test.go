package injector

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// deadRunner is the identity of a process that has exited.
func deadRunner(t *testing.T) Proc {
	t.Helper()
	c := exec.Command("/bin/true")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	p, err := Identify(c.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Wait()
	return p
}

func TestRecordPathsRefusesWhatIsNotARunDir(t *testing.T) {
	t.Setenv(EnvRegistry, filepath.Join(t.TempDir(), "registry"))
	sup, err := newBuiltin(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer sup.Close()
	base := t.TempDir()
	good := filepath.Join(base, "vmchaos-ok")
	other := filepath.Join(base, "results")
	link := filepath.Join(base, "vmchaos-link")
	for _, d := range []string{good, other} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(other, link); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{other, link, "vmchaos-relative", "/", good + "/", filepath.Join(base, "vmchaos-missing")} {
		if err := RecordPaths(sup, []string{bad}, nil); err == nil {
			t.Errorf("RecordPaths(%q) accepted", bad)
		}
	}
	for _, bad := range []string{"../vmchaos-x", "other", "vmchaos-a/b"} {
		if err := RecordPaths(sup, nil, []string{bad}); err == nil {
			t.Errorf("RecordPaths(netns %q) accepted", bad)
		}
	}
	if err := RecordPaths(sup, []string{good}, nil); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(sup.rec.path())
	if err != nil {
		t.Fatal(err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil || len(r.Paths) != 1 || r.Paths[0] != good {
		t.Fatalf("saved record paths = %v (%v), want [%s]", r.Paths, err, good)
	}
}

// TestCleanRemovesTheDeadRunsDirsMountsAndNetns plants the record of a
// SIGKILLed runner naming a stack dir (with a mount below it, as a FUSE
// mount whose server died would be) and a network namespace; the cleanup
// removes all three and a dir not named like a run dir stays.
func TestCleanRemovesTheDeadRunsDirsMountsAndNetns(t *testing.T) {
	reg := t.TempDir()
	base := t.TempDir()
	dir := filepath.Join(base, "vmchaos-planted")
	keep := filepath.Join(base, "keep-me")
	for _, d := range []string{filepath.Join(dir, "c1", "run"), keep} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rec := Record{RunID: "planted-paths", Kind: KindBuiltin, StateDir: filepath.Join(dir, "sup"), Runner: deadRunner(t),
		Created: time.Now(), Paths: []string{dir, keep}}
	mounted := ""
	if os.Geteuid() == 0 {
		m := filepath.Join(dir, "c1", "run")
		if err := unix.Mount("tmpfs", m, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatalf("mount tmpfs on %s: %v", m, err)
		}
		t.Cleanup(func() { _ = unix.Unmount(m, unix.MNT_DETACH) })
		mounted = m
	}
	var netns string
	if _, err := exec.LookPath("ip"); err == nil && os.Geteuid() == 0 {
		var b [4]byte
		_, _ = rand.Read(b[:])
		netns = "vmchaos-test-" + hex.EncodeToString(b[:])
		if out, err := exec.Command("ip", "netns", "add", netns).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add: %v\n%s", err, out)
		}
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", netns).Run() })
		rec.Netns = []string{netns}
	}
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(filepath.Join(reg, rec.RunID+".json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	ls, err := FindLeftovers(reg)
	if err != nil || len(ls) != 1 {
		t.Fatalf("leftovers = %v, %v", ls, err)
	}
	if len(ls[0].Paths) != 1 || ls[0].Paths[0] != dir {
		t.Errorf("leftover dirs = %v, want only %s (keep-me is not named like a run dir)", ls[0].Paths, dir)
	}
	if netns != "" && (len(ls[0].Netns) != 1 || !strings.Contains(ls[0].String(), "netns "+netns)) {
		t.Errorf("leftover line does not name the netns: %s", ls[0])
	}
	if _, err := CleanLeftovers(context.Background(), reg); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("run dir %s still there (%v)", dir, err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("a dir not named like a run dir was removed: %v", err)
	}
	if mounted != "" && len(mountsBelow(mounted)) != 0 {
		t.Errorf("mount %s still there", mounted)
	}
	if netns != "" {
		if _, err := os.Lstat(filepath.Join(netnsDir, netns)); !os.IsNotExist(err) {
			t.Errorf("netns %s still there (%v)", netns, err)
		}
	}
	t.Logf("root %v, netns %q, mount %q", os.Geteuid() == 0, netns, mounted)
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/plain`: "/plain", `/x\134y`: `/x\y`, `/end\04`: `/end\04`} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}
