package fakech_test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/failpoint"
)

func waitParked(t *testing.T, ctl, name string) (int, error) {
	return failpoint.WaitParked(ctxT(t), ctl, name)
}

// TestPowerButtonSyncsAndExits: an ACPI power-off lets the guest flush its
// page cache; the VMM then exits 0.
func TestPowerButtonSyncsAndExits(t *testing.T) {
	p, c, g, ip, dir := bootVM(t)
	g.sshRun(t, ip, "touch /var/lib/flushed-on-poweroff")
	if err := c.Do(ctxT(t), "PUT", chapi.EpPowerButton, nil, nil); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(); code != 0 {
		t.Fatalf("exit %d after power-button", code)
	}
	sock := filepath.Join(dir, "api2.sock")
	startReady(t, sock, baseEnv(), bootArgs(sock, g.path, ip)...)
	if _, _, st := g.sshRun(t, ip, "ls /var/lib/flushed-on-poweroff"); st != 0 {
		t.Fatal("a clean guest poweroff lost the page cache")
	}
}

// TestRebootIsAFreshBoot: vm.reboot resets the guest in the same process:
// new boot id, RAM and unsynced writes gone, same pid.
func TestRebootIsAFreshBoot(t *testing.T) {
	_, c, g, ip, _ := bootVM(t)
	id1, _, _ := g.sshRun(t, ip, "touch /run/r /var/lib/unsynced; cat /proc/sys/kernel/random/boot_id")
	ctx := ctxT(t)
	ping1, _ := c.Ping(ctx)
	if err := c.Do(ctx, "PUT", chapi.EpReboot, nil, nil); err != nil {
		t.Fatal(err)
	}
	out, _, _ := g.sshRun(t, ip, "cat /proc/sys/kernel/random/boot_id; ls /run /var/lib")
	if strings.HasPrefix(out, id1) || strings.Contains(out, "unsynced") || strings.Contains(out, "\nr\n") {
		t.Fatalf("after reboot: %q (old boot id %q)", out, id1)
	}
	if ping2, _ := c.Ping(ctx); ping2.Pid != ping1.Pid {
		t.Fatal("reboot changed the pid")
	}
}

// TestCLIRestore: --restore brings the snapshot back at start (Paused); a bad
// snapshot dir exits 1 with CH's chain.
func TestCLIRestore(t *testing.T) {
	p, c, g, ip, dir := bootVM(t)
	g.sshRun(t, ip, "touch /run/m")
	snap := snapshotVM(t, c, dir)
	p.kill9()
	sock := filepath.Join(vmDir(t, "VMCLIRESTORE"), "api.sock")
	// resume= arrived in v52 (v51 refuses it: TestRestoreOptionsByVersion).
	_, c2 := startReady(t, sock, baseEnv("FAKECH_COMPAT=v52"), "--api-socket", "path="+sock, "--restore", "source_url=file://"+snap+",resume=on")
	if info, err := c2.Info(ctxT(t)); err != nil || info.State != chapi.StateRunning {
		t.Fatalf("after --restore resume=on: %+v %v", info.State, err)
	}
	if _, _, st := g.sshRun(t, ip, "ls /run/m"); st != 0 {
		t.Fatal("RAM file lost by --restore")
	}
	bad := start(t, "", baseEnv(), "--api-socket", "path="+sock+".2", "--restore", "source_url=file://"+filepath.Join(dir, "nosnap"))
	if code := bad.wait(); code != 1 || !strings.Contains(bad.stderr.String(), "Error restoring VM") {
		t.Fatalf("bad --restore: exit %d\n%s", code, bad.stderr.String())
	}
}

// TestAPISocketFromFD: --api-socket fd=N serves an inherited listening
// socket, and never removes the path on exit.
func TestAPISocketFromFD(t *testing.T) {
	sock := filepath.Join(vmDir(t, "VMFD"), "api.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	cmd := exec.Command(fakechBin, "--api-socket", "fd=3")
	cmd.Env = baseEnv()
	cmd.ExtraFiles = []*os.File{f}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	c := chapi.New(sock)
	if err := c.WaitReady(ctxT(t)); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("with fd= the socket path is never removed: %v", err)
	}
}

// TestFailpointActionsInsideFakech: an error(msg) action turns the request
// into a 500 with msg innermost; a pause action parks the VMM thread until
// released, stalling every request as CH's busy thread would.
func TestFailpointActionsInsideFakech(t *testing.T) {
	ctl := t.TempDir()
	_, c, _, _, dir := bootVM(t, "VMCHAOS_FAILPOINTS=ch.snapshot.begin=1*error(disk full);ch.resume=pause", "VMCHAOS_FAILPOINT_CTL="+ctl)
	ctx := ctxT(t)
	if err := c.Pause(ctx, false); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(dir, "snap")
	os.Mkdir(snap, 0o755)
	e := chError(t, c.Snapshot(ctx, snap))
	if e.Status != 500 || e.Innermost() != "disk full" {
		t.Fatalf("snapshot with error action: %v", e)
	}
	// The failed attempt left nothing behind: a retry into the same dir works
	// (the action was 1*, so it fires once).
	if err := c.Snapshot(ctx, snap); err != nil {
		t.Fatalf("retry after an injected failure: %v", err)
	}
	resumed := make(chan error, 1)
	go func() { resumed <- c.Resume(ctx, false) }()
	pid, err := waitParked(t, ctl, "ch.resume")
	if err != nil || pid <= 0 {
		t.Fatalf("ch.resume not parked: %v", err)
	}
	// vm.info queues behind the parked request.
	infoDone := make(chan struct{})
	go func() { _, _ = c.Info(ctx); close(infoDone) }()
	select {
	case <-infoDone:
		t.Fatal("vm.info answered while the VMM thread was parked")
	case err := <-resumed:
		t.Fatalf("resume returned while parked: %v", err)
	case <-time.After(100 * time.Millisecond): // an unstalled vm.info answers in well under 1 ms
	}
	if err := os.WriteFile(filepath.Join(ctl, "ch.resume.release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-resumed; err != nil {
		t.Fatal(err)
	}
	<-infoDone
}
