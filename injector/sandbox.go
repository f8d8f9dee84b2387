package injector

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	sd "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
	"golang.org/x/sys/unix"
)

// The sandbox supervisor boots a real systemd as PID 1 of new pid, mount,
// cgroup, uts and ipc namespaces on a host whose PID 1 is not systemd (a
// container, CI), following ../shared/reference/systemd-in-namespace.sh:
//   - private /run and /dev, read-only /proc/sys and /sys, an overlay over
//     /etc, a cgroup2 mount rooted at <host cgroup2>/<name>;
//   - a unit path of stub targets only, generators off: no host unit ever
//     starts, so the host's /tmp, /etc, /run and sysctls stay as they were;
//   - shared with the host: network namespace, /tmp, /var (trace sockets,
//     state and logs live there);
//   - its /run/systemd/private only accepts peers in its pid namespace, so a
//     systemd-socket-proxyd inside exposes it at <state>/bus/private, which
//     the host dials with go-systemd.
//
// Go cannot run code between clone and exec, so the mounts are done by a
// small sh script that then execs systemd; everything else is here.

// SandboxStarted is how long the last sandbox took from clone to a running
// manager answering on D-Bus (for the benchmark and the report).
var SandboxStarted time.Duration

const (
	systemdBin = "/lib/systemd/systemd"
	proxydBin  = "/lib/systemd/systemd-socket-proxyd"
)

// SandboxPreflight says why a sandbox cannot run here ("" when it can).
func SandboxPreflight() string {
	if os.Geteuid() != 0 {
		return "needs root (namespaces, cgroup2, mounts)"
	}
	if cgroup2Mount() == "" {
		return "no cgroup2 mount"
	}
	for _, b := range []string{systemdBin, proxydBin, "/bin/sh", "/bin/mount", nsenterBin} {
		if _, err := os.Stat(b); err != nil {
			return "missing " + b + " (apt-get install systemd mount)"
		}
	}
	return ""
}

// newSandbox boots the sandbox: its record first (a runner killed from
// then on leaves what the next run cleans up from), then the namespaced
// init, then the manager answering on the proxied private bus.
func newSandbox(ctx context.Context, stateDir string) (Supervisor, error) {
	if why := SandboxPreflight(); why != "" {
		return nil, fmt.Errorf("%w: %s", ErrUnavailable, why)
	}
	t0 := time.Now()
	rec, err := newRecord(KindSandbox, stateDir)
	if err != nil {
		return nil, err
	}
	name := "vmchaos-sb-" + rec.RunID[len(rec.RunID)-8:]
	cg := filepath.Join(cgroup2Mount(), name)
	rec.Cgroup = cg
	D := stateDir
	if err := writeSandboxFiles(D, name); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	// Recorded before anything starts: a runner killed from here on leaves a
	// record the next run cleans up from.
	if err := rec.save(); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	fail := func(err error) (Supervisor, error) {
		ls, _ := FindLeftovers(Registry())
		for _, l := range ls {
			if l.Record.RunID == rec.RunID {
				_ = cleanLeftover(context.Background(), l)
			}
		}
		_ = removeCgroupTree(context.Background(), cg)
		removeSandboxScratch(D)
		rec.remove()
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	cmd, err := startSandboxInit(D, cg)
	if err != nil {
		return fail(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	initPID := cmd.Process.Pid
	ip, err := Identify(initPID)
	if err != nil {
		return fail(err)
	}
	rec.Init, rec.PidNS = &ip, pidNS(initPID)
	if err := rec.save(); err != nil {
		_ = signalProc(ip, syscall.SIGKILL)
		return fail(err)
	}
	killInit := func() {
		_ = signalProc(ip, syscall.SIGKILL)
		deadline := time.After(10 * time.Second)
		for {
			select {
			case <-exited:
				return
			case <-deadline:
				return
			case <-time.After(10 * time.Millisecond):
				reapNSOrphans(rec.PidNS)
			}
		}
	}
	conn, err := waitSandboxBus(ctx, D, exited, killInit)
	if err != nil {
		return fail(err)
	}
	SandboxStarted = time.Since(t0)
	return sandboxSup(conn, rec, D, initPID, killInit), nil
}

// startSandboxInit starts inner.sh (which execs systemd) as PID 1 of new
// namespaces, born in the cgroup cg it creates.
func startSandboxInit(D, cg string) (*exec.Cmd, error) {
	if err := os.Mkdir(cg, 0o755); err != nil {
		return nil, err
	}
	cgfd, err := syscall.Open(cg, syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(cgfd)
	logf, err := os.OpenFile(filepath.Join(D, "sandbox.log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := &exec.Cmd{
		Path: "/bin/sh", Args: []string{"sh", filepath.Join(D, "inner.sh")},
		Env:    []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Stdout: logf, Stderr: logf,
		SysProcAttr: &syscall.SysProcAttr{
			Setsid: true,
			// PID 1 of a new pid namespace, born inside <cgroup2>/<name> ...
			Cloneflags:  syscall.CLONE_NEWPID,
			UseCgroupFD: true, CgroupFD: cgfd,
			// ... then its own cgroup namespace rooted there, and mount/uts/ipc
			// namespaces; with CLONE_NEWNS here Go also makes / rprivate, so
			// no mount propagates back to the host.
			Unshareflags: syscall.CLONE_NEWCGROUP | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
		},
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start namespaced init: %w", err)
	}
	return cmd, nil
}

// waitSandboxBus waits for the proxied private bus socket, then for the
// manager to finish booting its tiny target; on a timeout it kills the
// init (killInit).
func waitSandboxBus(ctx context.Context, D string, exited <-chan error, killInit func()) (*sd.Conn, error) {
	sock := filepath.Join(D, "bus", "private")
	bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var conn *sd.Conn
	for {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			if conn, err = dialPrivate(sock); err == nil {
				break
			}
		}
		select {
		case err := <-exited:
			b, _ := os.ReadFile(filepath.Join(D, "sandbox.log"))
			return nil, fmt.Errorf("namespaced systemd exited (%v): %s", err, strings.TrimSpace(string(b)))
		case <-bctx.Done():
			killInit()
			return nil, fmt.Errorf("systemd did not come up: %w (see %s)", bctx.Err(), filepath.Join(D, "systemd.log"))
		case <-time.After(2 * time.Millisecond):
		}
	}
	for {
		st, err := conn.SystemStateContext(bctx)
		if err == nil {
			if v, _ := st.Value.Value().(string); v == "running" || v == "degraded" {
				return conn, nil
			}
		}
		if bctx.Err() != nil {
			conn.Close()
			killInit()
			return nil, fmt.Errorf("systemd did not reach running: %w", bctx.Err())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// sandboxSup is the supervisor over the booted sandbox: its scope is the
// sandbox's pid namespace, and its teardown kills the namespace's PID 1.
func sandboxSup(conn *sd.Conn, rec *Record, D string, initPID int, killInit func()) *dbusSup {
	cg := rec.Cgroup
	s := &dbusSup{kind: KindSandbox, conn: conn, rec: rec, cgRoot: cg, self: os.Getpid(), units: map[string]UnitSpec{},
		managerPID: initPID}
	ns := rec.PidNS
	s.inScope = func(p Proc) bool { return pidNS(p.PID) == ns && p.PID != initPID }
	s.toHost = func(pid int) (int, error) { return sandboxHostPID(cg, ns, pid) }
	s.teardown = func() error {
		killInit() // PID 1 of the namespace: the kernel kills everything in it
		var errs []error
		for _, pid := range allPIDs() {
			if pidNS(pid) == ns {
				errs = append(errs, fmt.Errorf("pid %d still in the sandbox pid namespace", pid))
			}
		}
		if err := removeCgroupTree(context.Background(), cg); err != nil {
			errs = append(errs, err)
		}
		removeSandboxScratch(D)
		removeRecordsOfNS(Registry(), ns) // runs made inside died with the namespace
		return errors.Join(errs...)
	}
	return s
}

// reapNSOrphans reaps the zombies of pid namespace ns that are this
// process's children. The namespace's PID 1 cannot finish exiting while one
// of its processes is a zombie whose parent is outside (kernel/pid_namespace.c
// zap_pid_ns_processes waits for every pid to be freed). A command entered with
// nsenter whose nsenter was killed first is reparented to the nearest child
// subreaper on the host, which is this process when a builtin supervisor or
// ReapOrphans made it one, and os/exec never waits for it.
func reapNSOrphans(ns string) {
	self := os.Getpid()
	for _, pid := range allPIDs() {
		st, err := readStat(pid)
		if err != nil || st.state != 'Z' || st.ppid != self || pidNS(pid) != ns {
			continue
		}
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
}

// dialPrivate connects to systemd's private peer-to-peer protocol at path:
// EXTERNAL auth, no Hello (there is no bus daemon).
func dialPrivate(path string) (*sd.Conn, error) {
	// A quick connect probe first: go-systemd retries nothing itself.
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return nil, err
	}
	c.Close()
	// go-systemd dials twice, one connection for calls and one for signals.
	// systemd sends every unit's PropertiesChanged to every private-bus
	// connection, subscribed or not (src/core/dbus.c, bus_foreach_bus:
	// "Send to all direct buses, unconditionally"), and godbus decodes each
	// in full: with two connections the harness decoded each signal twice,
	// 70 % of what a sandbox bench row allocated, and its GC stops held the
	// trace reader up. One connection serves both (godbus's Close is once).
	var conn *dbus.Conn
	return sd.NewConnection(func() (*dbus.Conn, error) {
		if conn != nil {
			return conn, nil
		}
		// No dbus.WithContext: the connection lives as long as the supervisor.
		nc, err := dbus.Dial("unix:path=" + path)
		if err != nil {
			return nil, err
		}
		if err := nc.Auth([]dbus.Auth{dbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
			nc.Close()
			return nil, err
		}
		conn = nc
		return conn, nil
	})
}

// sandboxHostPID maps a pid of the sandbox's namespace to the host pid: the
// process in the sandbox cgroup tree whose innermost NSpid is pid.
func sandboxHostPID(cg, ns string, pid int) (int, error) {
	for _, h := range cgroupProcs(cg) {
		if n := nsPIDs(h); len(n) > 1 && n[len(n)-1] == pid && pidNS(h) == ns {
			return h, nil
		}
	}
	// Not in a cgroup we can see (already moved or exiting): scan everything.
	for _, h := range allPIDs() {
		if n := nsPIDs(h); len(n) > 1 && n[len(n)-1] == pid && pidNS(h) == ns {
			return h, nil
		}
	}
	return 0, fmt.Errorf("sandbox pid %d: %w", pid, ErrGone)
}

// removeSandboxScratch removes what a sandbox wrote into its state dir
// (logs are kept).
func removeSandboxScratch(dir string) {
	for _, p := range []string{"etc-upper", "etc-work", "bus", "units", "empty", "inner.sh"} {
		_ = os.RemoveAll(filepath.Join(dir, p))
	}
}

// writeSandboxFiles writes the stub unit set and the namespace init script.
func writeSandboxFiles(D, name string) error {
	U := filepath.Join(D, "units")
	removeSandboxScratch(D)
	for _, d := range []string{U, filepath.Join(D, "empty"), filepath.Join(D, "bus"), filepath.Join(D, "etc-upper"), filepath.Join(D, "etc-work")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	stub := func(unit, extra string) error {
		return os.WriteFile(filepath.Join(U, unit), []byte("[Unit]\nDescription="+name+" stub "+unit+"\n"+extra), 0o644)
	}
	files := []struct{ unit, extra string }{
		{"sysinit.target", "DefaultDependencies=no\n"},
		{"local-fs.target", "DefaultDependencies=no\n"},
		{"swap.target", ""}, {"sockets.target", ""}, {"paths.target", ""},
		{"timers.target", "DefaultDependencies=no\n"},
		{"slices.target", "Wants=-.slice system.slice\nAfter=-.slice system.slice\n"},
		{"basic.target", "Requires=sysinit.target\nWants=sockets.target timers.target paths.target slices.target\nAfter=sysinit.target sockets.target timers.target paths.target slices.target\n"},
		{name + ".target", "Requires=basic.target\nAfter=basic.target\nWants=" + name + "-private-proxy.socket\nAllowIsolate=yes\n"},
	}
	for _, f := range files {
		if err := stub(f.unit, f.extra); err != nil {
			return err
		}
	}
	// shutdown machinery: the host's own unit files
	for _, u := range []string{"shutdown.target", "umount.target", "final.target", "exit.target", "systemd-exit.service"} {
		if _, err := os.Stat("/lib/systemd/system/" + u); err == nil {
			if err := os.Symlink("/lib/systemd/system/"+u, filepath.Join(U, u)); err != nil {
				return err
			}
		}
	}
	sock := "[Unit]\nDefaultDependencies=no\n[Socket]\nListenStream=" + filepath.Join(D, "bus", "private") + "\nSocketMode=0600\n"
	svc := "[Unit]\nDefaultDependencies=no\nRequires=" + name + "-private-proxy.socket\nAfter=" + name + "-private-proxy.socket\n" +
		"[Service]\nExecStart=" + proxydBin + " /run/systemd/private\nStandardOutput=null\nStandardError=append:" + filepath.Join(D, "proxyd.log") + "\n"
	if err := os.WriteFile(filepath.Join(U, name+"-private-proxy.socket"), []byte(sock), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(U, name+"-private-proxy.service"), []byte(svc), 0o644); err != nil {
		return err
	}
	inner := `#!/bin/sh
# PID 1 of the sandbox's namespaces: build its view of the system, then exec systemd.
set -eu
D=` + shellQuote(D) + `
mount -t proc -o nosuid,nodev,noexec proc /proc
mount --bind /proc/sys /proc/sys; mount -o remount,bind,ro,nosuid,nodev,noexec /proc/sys
mount -t tmpfs -o mode=755,nosuid,nodev,size=64m tmpfs /run
S=/run/.dev; mkdir $S; mount -t tmpfs -o mode=755,nosuid,size=4m tmpfs $S
for n in null zero full random urandom tty; do touch $S/$n; mount --bind /dev/$n $S/$n; done
for n in fuse kvm; do if [ -c /dev/$n ]; then touch $S/$n; mount --bind /dev/$n $S/$n; fi; done   # lazyfs (power cut), real CH
mkdir $S/pts $S/shm $S/mqueue
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts $S/pts; ln -s pts/ptmx $S/ptmx
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs $S/shm
ln -s /proc/self/fd $S/fd; ln -s /proc/self/fd/0 $S/stdin; ln -s /proc/self/fd/1 $S/stdout; ln -s /proc/self/fd/2 $S/stderr
: >"$D/systemd.log"; touch $S/kmsg; mount --bind "$D/systemd.log" $S/kmsg   # PID 1 logs to "kmsg" = this file
mount --move $S /dev; rmdir $S
mount --bind /sys /sys; mount -o remount,bind,ro,nosuid,nodev,noexec /sys   # drops the host cgroup submounts
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 /sys/fs/cgroup             # rooted at our cgroup (cgroup ns)
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$D/etc-upper,workdir=$D/etc-work" /etc
mkdir -p /run/systemd/system
exec env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin container=` + name + ` \
  SYSTEMD_UNIT_PATH="/run/systemd/transient:/run/systemd/system:$D/units" \
  SYSTEMD_GENERATOR_PATH="$D/empty" SYSTEMD_ENVIRONMENT_GENERATOR_PATH="$D/empty" \
  ` + systemdBin + ` --system --unit=` + name + `.target --log-target=kmsg --log-level=info --show-status=no
`
	return os.WriteFile(filepath.Join(D, "inner.sh"), []byte(inner), 0o755)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// UnitDir returns the directory a sandbox's systemd loads unit files from
// (write a file there, then run `systemctl daemon-reload` through Command), or
// "" for other kinds: only a private systemd may be handed arbitrary units.
func UnitDir(sup Supervisor) string {
	if s, ok := sup.(*dbusSup); ok && s.kind == KindSandbox {
		return filepath.Join(s.rec.StateDir, "units")
	}
	return ""
}

// Command returns a command that sees the system as sup's units do. For a
// sandbox that means inside its pid and mount namespaces (through nsenter):
// the stack records pids as it sees them (vmctl's VMM pid, agent children),
// and only a process in the same namespaces reads /proc consistently with
// them. For other kinds it is exec.CommandContext.
func Command(ctx context.Context, sup Supervisor, argv ...string) *exec.Cmd {
	if s, ok := sup.(*dbusSup); ok && s.kind == KindSandbox && s.rec.Init != nil {
		args := append([]string{"--target", strconv.Itoa(s.rec.Init.PID), "--all", "--"}, argv...)
		return exec.CommandContext(ctx, nsenterBin, args...)
	}
	return exec.CommandContext(ctx, argv[0], argv[1:]...)
}

// nsenterBin is util-linux's nsenter (preinstalled with mount).
const nsenterBin = "/usr/bin/nsenter"
