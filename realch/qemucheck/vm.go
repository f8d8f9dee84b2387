package qemucheck

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmchaos/vmchaos/internal/lockedbuf"
	"github.com/vmchaos/vmchaos/vmnet"
)

// vmSpec is one boot of the guest under QEMU.
type vmSpec struct {
	QEMU      string
	Kernel    string
	Initramfs string
	Cmdline   string
	Disk      string // the run's copy of the image (raw)
	DiskCache string // "none" or "writethrough": a guest flush reaches the image file
	Seed      string // the NoCloud seed (raw FAT, read-only)
	NIC       vmnet.NIC
	MemoryMiB int
	CPUs      int
	Serial    string // the serial console's log
}

// args is QEMU's command line for s. TCG only: this check must run where
// /dev/kvm cannot run a stock kernel (kvm_pvm) or is absent. The machine is
// as close to realch's cloud-hypervisor boot as QEMU gets: the same kernel
// (the PVH vmlinux or a bzImage, by -kernel), initramfs and command line, the
// disk and the seed as virtio-blk, one virtio-net NIC on the run's TAP with
// the planned MAC, the console on the first serial port.
func (s vmSpec) args() []string {
	return []string{
		"-name", "vmchaos-image-check",
		"-machine", "pc", "-accel", "tcg", "-cpu", "max",
		"-smp", fmt.Sprint(s.CPUs), "-m", fmt.Sprint(s.MemoryMiB),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-serial", "file:" + s.Serial,
		"-kernel", s.Kernel, "-initrd", s.Initramfs, "-append", s.Cmdline,
		// cache=none (O_DIRECT) or writethrough: the guest's flush is the
		// host's fsync, so "fsynced in the guest" means "in the image".
		"-drive", "file=" + s.Disk + ",if=none,id=disk0,format=raw,cache=" + s.DiskCache,
		"-device", "virtio-blk-pci,drive=disk0",
		"-drive", "file=" + s.Seed + ",if=none,id=seed0,format=raw,readonly=on",
		"-device", "virtio-blk-pci,drive=seed0",
		"-netdev", "tap,id=net0,ifname=" + s.NIC.Tap + ",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=net0,mac=" + s.NIC.MAC,
		"-object", "rng-random,id=rng0,filename=/dev/urandom",
		"-device", "virtio-rng-pci,rng=rng0",
	}
}

// milestone is one point of the boot the serial console shows.
type milestone struct {
	Name string
	RE   *regexp.Regexp
}

// milestones are the boot's points in order: the kernel runs, the initramfs
// runs (userspace), systemd runs from the root file system.
var milestones = []milestone{
	{"kernel", regexp.MustCompile(`Linux version \S+`)},
	{"initramfs", regexp.MustCompile(`Run /init as init process`)},
	{"systemd", regexp.MustCompile(`Welcome to .*!|systemd\[1\]: .*running in system mode`)},
}

// seen is a milestone met: when (from QEMU's start) and the line.
type seen struct {
	At   time.Duration
	Line string
}

// vm is one running QEMU, tracked by its pid (os.Process holds a pidfd).
type vm struct {
	spec    vmSpec
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{}
	waitErr error
	out     *lockedbuf.Buffer // QEMU's own stdout+stderr

	mu   sync.Mutex
	seen map[string]seen
}

// startVM starts QEMU inside ns (`ip netns exec` execs it in place, so the
// pid is QEMU's) and watches its serial log.
func startVM(ns *vmnet.Netns, spec vmSpec) (*vm, error) {
	if err := os.WriteFile(spec.Serial, nil, 0o644); err != nil {
		return nil, fmt.Errorf("qemu: serial log: %w", err)
	}
	v := &vm{spec: spec, done: make(chan struct{}), seen: map[string]seen{}, out: &lockedbuf.Buffer{}}
	// Not CommandContext: the check kills QEMU itself, by pid, when it
	// chooses to (the kill -9 is one of the checks).
	v.cmd = ns.Command(context.Background(), spec.QEMU, spec.args()...)
	v.cmd.Stdout, v.cmd.Stderr = v.out, v.out
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	v.started = time.Now()
	if err := v.cmd.Start(); err != nil {
		return nil, fmt.Errorf("qemu: start %s: %w", spec.QEMU, err)
	}
	go func() {
		v.waitErr = v.cmd.Wait()
		close(v.done)
	}()
	go v.watchSerial()
	return v, nil
}

// Pid is QEMU's pid.
func (v *vm) Pid() int { return v.cmd.Process.Pid }

// exe is what /proc says the pid runs (evidence that the pid killed is QEMU).
func (v *vm) exe() string {
	p, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", v.Pid()))
	if err != nil {
		return "?"
	}
	return filepath.Base(p)
}

// watchSerial notes each milestone's first appearance in the serial log
// until QEMU exits (a last pass then reads what was left).
func (v *vm) watchSerial() {
	var off int64
	var partial string
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		exited := false
		select {
		case <-v.done:
			exited = true
		case <-tick.C:
		}
		off, partial = v.readSerial(off, partial)
		if exited {
			return
		}
	}
}

// readSerial reads the serial log from off and notes the milestones of its
// complete lines (and of the prompt, which has no newline yet).
func (v *vm) readSerial(off int64, partial string) (int64, string) {
	f, err := os.Open(v.spec.Serial)
	if err != nil {
		return off, partial
	}
	defer f.Close()
	b, err := io.ReadAll(io.NewSectionReader(f, off, 1<<40))
	if err != nil || len(b) == 0 {
		return off, partial
	}
	now := time.Since(v.started)
	text := partial + string(b)
	lines := strings.Split(text, "\n")
	partial = lines[len(lines)-1]
	for _, ln := range append(lines[:len(lines)-1], partial) {
		ln = strings.TrimRight(ln, "\r")
		for _, m := range milestones {
			if m.RE.MatchString(ln) {
				v.note(m.Name, now, ln)
			}
		}
	}
	return off + int64(len(b)), partial
}

func (v *vm) note(name string, at time.Duration, line string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.seen[name]; !ok {
		v.seen[name] = seen{At: at, Line: strings.TrimSpace(line)}
	}
}

// Seen is the milestone's first appearance, if any.
func (v *vm) Seen(name string) (seen, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	s, ok := v.seen[name]
	return s, ok
}

// waitMilestone waits for a milestone, QEMU's exit or ctx.
func (v *vm) waitMilestone(ctx context.Context, name string) (seen, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if s, ok := v.Seen(name); ok {
			return s, nil
		}
		select {
		case <-ctx.Done():
			return seen{}, fmt.Errorf("serial console: no %q line after %s: %w", name, time.Since(v.started).Round(time.Second), ctx.Err())
		case <-v.done:
			time.Sleep(200 * time.Millisecond) // the watcher's last pass
			if s, ok := v.Seen(name); ok {
				return s, nil
			}
			return seen{}, fmt.Errorf("qemu exited (%v) before the serial console showed %q: %s", v.waitErr, name, v.Output())
		case <-tick.C:
		}
	}
}

// Output is QEMU's own output (its errors), trimmed.
func (v *vm) Output() string {
	return strings.TrimSpace(v.out.String())
}

// wait waits for QEMU to exit, bounded by ctx.
func (v *vm) wait(ctx context.Context) error {
	select {
	case <-v.done:
		return v.waitErr
	case <-ctx.Done():
		return fmt.Errorf("qemu pid %d still running after %s: %w", v.Pid(), time.Since(v.started).Round(time.Second), ctx.Err())
	}
}

// kill sends SIGKILL to QEMU's pid (through its pidfd) and reaps it.
func (v *vm) kill() error {
	if err := v.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("qemu pid %d: kill -9: %w", v.Pid(), err)
	}
	<-v.done
	return nil
}
