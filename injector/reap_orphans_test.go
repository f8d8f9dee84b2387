package injector

import (
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// orphanSleep starts a `sleep` whose parent exits at once, so it is
// reparented to this process (a subreaper), and kills it: its zombie is
// ours to reap. It returns the orphan's pid.
func orphanSleep(t *testing.T) int {
	t.Helper()
	out, err := exec.Command("sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!").Output()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	return pid
}

// zombieFor reports whether pid stays an unreaped zombie for d (once it
// has died: right after the SIGKILL it may still be exiting).
func zombieFor(pid int, d time.Duration) bool {
	for i := 0; i < 100; i++ {
		if st, err := readStat(pid); err != nil || st.state == 'Z' {
			break
		}
		time.Sleep(time.Millisecond)
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		st, err := readStat(pid)
		if err != nil || st.state != 'Z' {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// The one reaper collects an orphan whose task name was registered by
// ReapOrphans (a manager case's VMMs), and leaves any other orphan alone.
func TestReapOrphansReapsOnlyRegisteredNames(t *testing.T) {
	release, err := ReapOrphans("no-such-binary")
	if err != nil {
		t.Fatal(err)
	}
	pid := orphanSleep(t)
	if !zombieFor(pid, 500*time.Millisecond) {
		t.Fatalf("orphan %d of an unregistered name was reaped (or never reparented here)", pid)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil {
		t.Fatal(err)
	}
	release()

	release, err = ReapOrphans("/usr/bin/sleep")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	pid = orphanSleep(t)
	if zombieFor(pid, 5*time.Second) {
		t.Fatalf("orphan sleep %d of a registered name is still a zombie after 5s", pid)
	}
}
