package ownedtemp

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes the test binary a process that makes an owned dir,
// prints it and waits to be killed: a `go test` killed before its cleanup.
const helperEnv = "VMCHAOS_OWNEDTEMP_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		d, err := Mkdir("vmchaos-bin-")
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(2)
		}
		os.Stdout.WriteString(d + "\n")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestKilledOwnersDirIsCleanedAndALiveOnesIsNot: a process killed with
// SIGKILL (no cleanup runs) leaves its owned dir; while it lived the dir
// was Live and CleanDead kept it; once it is dead CleanDead removes it,
// and leaves a live owner's dir, an unowned dir and a dir whose owner file
// is unreadable.
func TestKilledOwnersDirIsCleanedAndALiveOnesIsNot(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	killed := strings.TrimSpace(line)

	mine, err := Mkdir("vmchaos-bin-")
	if err != nil {
		t.Fatal(err)
	}
	unowned := filepath.Join(tmp, "vmchaos-42")
	bad := filepath.Join(tmp, "vmchaos-bad")
	for _, d := range []string{unowned, bad} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(bad, ownerFile), []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}

	for d, want := range map[string]State{killed: Live, mine: Live, unowned: Unowned, bad: BadOwner} {
		if got := Of(d); got != want {
			t.Errorf("before the kill: Of(%s) = %d, want %d", d, got, want)
		}
	}
	if removed, err := CleanDead(nil); err != nil || len(removed) != 0 {
		t.Fatalf("before the kill: CleanDead = %v, %v; want nothing removed", removed, err)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if got := Of(killed); got != DeadOwner {
		t.Fatalf("after the kill: Of(%s) = %d, want DeadOwner", killed, got)
	}
	removed, err := CleanDead(nil)
	if err != nil || !slices.Equal(removed, []string{killed}) {
		t.Fatalf("after the kill: CleanDead = %v, %v; want [%s]", removed, err, killed)
	}
	for _, d := range []string{mine, unowned, bad} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s removed: %v", d, err)
		}
	}
	if _, err := os.Stat(killed); !os.IsNotExist(err) {
		t.Errorf("%s still there: %v", killed, err)
	}
}

func TestMkdirRefusesAPatternOutsideVmchaos(t *testing.T) {
	if d, err := Mkdir("other-"); err == nil {
		os.RemoveAll(d)
		t.Fatalf("Mkdir(other-) = %s, want an error", d)
	}
}
