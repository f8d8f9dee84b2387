package realch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/cidata"
	"github.com/vmchaos/vmchaos/vmnet"
)

// LaunchSpec is one VM to boot.
type LaunchSpec struct {
	// Dir is the VM's working directory (created if missing, caller-owned):
	// api.sock, disk.img (the copy of Env.Image), cidata.img, serial.log,
	// ch.log, events.json and ch.out (the VMM's stdout and stderr) go there.
	Dir       string
	CPUs      int    // default 1
	MemoryMiB int    // default 512
	Cmdline   string // kernel boot only; default cidata.DefaultCmdline
	NICs      []vmnet.NIC
	// CloudInit, when set, is written as the NoCloud seed and attached as a
	// second, read-only disk.
	CloudInit *cidata.CloudInit
	// Netns, when set, runs the VMM inside that namespace (where its taps are).
	Netns *vmnet.Netns
	// ReadyTimeout bounds the wait for vmm.ping; default 30s (CH's own tests
	// give 5s on an idle machine; runners are busy).
	ReadyTimeout time.Duration
	// StopTimeout is the SIGTERM grace before SIGKILL; default 10s, as in
	// CH's integration tests.
	StopTimeout time.Duration
}

// File names inside LaunchSpec.Dir.
const (
	SocketName = "api.sock"
	DiskName   = "disk.img"
	CIDataName = "cidata.img"
	SerialName = "serial.log"
	LogName    = "ch.log"
	EventsName = "events.json"
	OutName    = "ch.out"
)

// VMM is a running cloud-hypervisor process this package started.
type VMM struct {
	Pid    int
	Dir    string
	Socket string
	Disk   string
	CIData string // "" when no seed was attached
	Serial string
	Log    string
	Events string   // CH's --event-monitor output (booted, paused, shutdown, ...)
	Argv   []string // the command line as started (after any `ip netns exec` prefix)

	cmd     *exec.Cmd
	stopTO  time.Duration
	done    chan struct{}
	waitErr error

	stopOnce sync.Once
	stopErr  error
}

// maxSunPath is sizeof(sockaddr_un.sun_path) minus the terminating NUL.
const maxSunPath = 107

// Launch copies the image, writes the seed, starts cloud-hypervisor with
// --api-socket, the payload, --disk, --net, --serial file= and --console off,
// and waits for vmm.ping. On any failure the process is killed and reaped
// before Launch returns.
func Launch(ctx context.Context, env *Env, spec LaunchSpec) (*VMM, error) {
	if err := checkLaunch(env, spec); err != nil {
		return nil, err
	}
	v, err := prepareDir(env, spec)
	if err != nil {
		return nil, err
	}
	args, err := v.args(env, spec)
	if err != nil {
		v.removeFiles()
		return nil, fmt.Errorf("launch: %w", err)
	}
	v.Argv = append([]string{env.CHBinary}, args...)
	if err := v.start(env, spec, args); err != nil {
		v.removeFiles()
		return nil, err
	}
	if err := v.waitReady(ctx, spec.ReadyTimeout); err != nil {
		_ = v.Stop(context.Background())
		return nil, fmt.Errorf("launch %s: %w%s", env.CHBinary, err, v.tail())
	}
	return v, nil
}

// checkLaunch refuses an Env or spec Launch cannot start from.
func checkLaunch(env *Env, spec LaunchSpec) error {
	switch {
	case env == nil || env.CHBinary == "":
		return errors.New("launch: no cloud-hypervisor binary (run Discover)")
	case env.Firmware == "" && env.Kernel == "":
		return errors.New("launch: no firmware or kernel in Env")
	case env.Image == "":
		return errors.New("launch: no guest image in Env")
	case spec.Dir == "":
		return errors.New("launch: LaunchSpec.Dir is empty")
	}
	return nil
}

// prepareDir makes the VM's dir and fills it: no stale socket, the VM's own
// copy of the image, the seed when the spec has one.
func prepareDir(env *Env, spec LaunchSpec) (*VMM, error) {
	dir, err := filepath.Abs(spec.Dir)
	if err != nil {
		return nil, fmt.Errorf("launch: dir: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("launch: dir: %w", err)
	}
	v := &VMM{
		Dir:    dir,
		Socket: filepath.Join(dir, SocketName),
		Disk:   filepath.Join(dir, DiskName),
		Serial: filepath.Join(dir, SerialName),
		Log:    filepath.Join(dir, LogName),
		Events: filepath.Join(dir, EventsName),
		stopTO: spec.StopTimeout,
		done:   make(chan struct{}),
	}
	if v.stopTO <= 0 {
		v.stopTO = 10 * time.Second
	}
	if len(v.Socket) > maxSunPath {
		return nil, fmt.Errorf("launch: api socket path %s is %d bytes, over the %d a unix socket allows: use a shorter Dir", v.Socket, len(v.Socket), maxSunPath)
	}
	// ≤v52 refuses to bind over any existing path, stale or not; this Dir is
	// ours, so a leftover socket is from a dead VMM of ours.
	if err := removeIfExists(v.Socket); err != nil {
		return nil, fmt.Errorf("launch: stale socket: %w", err)
	}
	if err := copyImage(env.Image, v.Disk); err != nil {
		return nil, fmt.Errorf("launch: copy image: %w", err)
	}
	if spec.CloudInit != nil {
		v.CIData = filepath.Join(dir, CIDataName)
		if err := cidata.BuildCIData(v.CIData, *spec.CloudInit); err != nil {
			v.removeFiles()
			return nil, fmt.Errorf("launch: %w", err)
		}
	}
	return v, nil
}

// start runs cloud-hypervisor (inside spec.Netns when set) with its output
// in OutName. The process must outlive the launch's ctx, so it is started
// without CommandContext and stopped by Stop.
func (v *VMM) start(env *Env, spec LaunchSpec, args []string) error {
	out, err := os.OpenFile(filepath.Join(v.Dir, OutName), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	var cmd *exec.Cmd
	if spec.Netns != nil {
		cmd = spec.Netns.Command(context.Background(), env.CHBinary, args...)
	} else {
		cmd = exec.Command(env.CHBinary, args...)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Dir = v.Dir
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("launch: start %s: %w", env.CHBinary, err)
	}
	v.cmd = cmd
	v.Pid = cmd.Process.Pid
	// The owner of this goroutine is the VMM: it ends when the process is reaped.
	go func() {
		v.waitErr = cmd.Wait()
		out.Close()
		close(v.done)
	}()
	return nil
}

// waitReady waits up to rto (default 30s) for the VMM to answer and its
// command-line VM to exist, or for the process to exit.
func (v *VMM) waitReady(ctx context.Context, rto time.Duration) error {
	if rto <= 0 {
		rto = 30 * time.Second
	}
	rctx, cancel := context.WithTimeout(ctx, rto)
	defer cancel()
	ready := make(chan error, 1)
	go func() {
		// CH answers vmm.ping before its main thread created the
		// command-line VM: ready means the VM exists.
		err := v.Client().WaitReady(rctx)
		if err == nil {
			_, err = v.Client().WaitVM(rctx)
		}
		ready <- err
	}()
	select {
	case err := <-ready:
		return err
	case <-v.done:
		cancel()
		<-ready
		return fmt.Errorf("exited before answering vmm.ping: %v", v.waitErr)
	}
}

func (v *VMM) args(env *Env, spec LaunchSpec) ([]string, error) {
	cpus := spec.CPUs
	if cpus <= 0 {
		cpus = 1
	}
	mem := spec.MemoryMiB
	if mem <= 0 {
		mem = 512
	}
	args := []string{
		"--api-socket", "path=" + v.Socket,
		"--cpus", "boot=" + strconv.Itoa(cpus),
		"--memory", "size=" + strconv.Itoa(mem) + "M",
	}
	if env.Firmware != "" {
		args = append(args, "--firmware", env.Firmware)
	} else {
		cmdline := spec.Cmdline
		if cmdline == "" {
			cmdline = cidata.DefaultCmdline
		}
		args = append(args, "--kernel", env.Kernel, "--cmdline", cmdline)
		if env.Initramfs != "" {
			args = append(args, "--initramfs", env.Initramfs)
		}
	}
	for _, p := range []string{v.Disk, v.CIData, v.Serial, v.Log, v.Events} {
		// CH's option syntax splits on commas and '='.
		if strings.ContainsAny(p, ",=") {
			return nil, fmt.Errorf("path %q contains ',' or '=', which cloud-hypervisor's option syntax cannot carry", p)
		}
	}
	// An explicit image_type: CH v53 warns that autodetection is deprecated
	// ("will be removed") and, for raw, disables writes to sector 0.
	args = append(args, "--disk", "path="+v.Disk+",image_type="+diskImageType(v.Disk))
	if v.CIData != "" {
		args = append(args, "path="+v.CIData+",readonly=on,image_type=raw")
	}
	if len(spec.NICs) > 0 {
		args = append(args, "--net")
		for i, n := range spec.NICs {
			opt, err := n.Arg()
			if err != nil {
				return nil, fmt.Errorf("nic %d: %w", i, err)
			}
			args = append(args, opt)
		}
	}
	args = append(args, "--serial", "file="+v.Serial, "--console", "off", "--log-file", v.Log,
		"--event-monitor", "path="+v.Events)
	return args, nil
}

// diskImageType is "qcow2" for a file with the qcow2 magic, else "raw".
func diskImageType(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "raw"
	}
	defer f.Close()
	magic := make([]byte, 4)
	if _, err := io.ReadFull(f, magic); err == nil && string(magic) == "QFI\xfb" {
		return "qcow2"
	}
	return "raw"
}

// Client returns an API client for this VMM's socket.
func (v *VMM) Client() *chapi.Client { return chapi.New(v.Socket) }

// Done is closed once the process has exited and been reaped.
func (v *VMM) Done() <-chan struct{} { return v.done }

// ExitErr is the process's wait status once Done is closed (nil: exit 0).
func (v *VMM) ExitErr() error {
	select {
	case <-v.done:
		return v.waitErr
	default:
		return nil
	}
}

// Stop ends the VMM the way CH's own tests do: SIGTERM (graceful, exit 0),
// then SIGKILL after StopTimeout or when ctx ends. It reaps the process and
// removes the socket, its lock file, the disk copy and the seed; serial.log,
// ch.log, events.json and ch.out stay in Dir as evidence. Safe to call more than once.
func (v *VMM) Stop(ctx context.Context) error {
	v.stopOnce.Do(func() { v.stopErr = v.stop(ctx) })
	return v.stopErr
}

func (v *VMM) stop(ctx context.Context) error {
	var errs []error
	select {
	case <-v.done:
	default:
		// os.Process signals through a pidfd, so a reused pid is never hit.
		if err := v.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			errs = append(errs, fmt.Errorf("sigterm: %w", err))
		}
		t := time.NewTimer(v.stopTO)
		select {
		case <-v.done:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		select {
		case <-v.done:
		default:
			if err := v.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
				errs = append(errs, fmt.Errorf("sigkill: %w", err))
			}
			<-v.done
		}
	}
	errs = append(errs, v.removeFiles())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop vmm pid %d: %w", v.Pid, err)
	}
	return nil
}

// removeFiles deletes what Launch created apart from the logs.
func (v *VMM) removeFiles() error {
	var errs []error
	for _, p := range []string{v.Socket, v.Socket + ".lock", v.Disk, v.CIData} {
		if p == "" {
			continue
		}
		if err := removeIfExists(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// tail returns the end of the VMM's output and log for an error message.
func (v *VMM) tail() string {
	var b strings.Builder
	for _, p := range []string{filepath.Join(v.Dir, OutName), v.Log} {
		data, err := os.ReadFile(p)
		if err != nil || len(strings.TrimSpace(string(data))) == 0 {
			continue
		}
		s := strings.TrimSpace(string(data))
		if len(s) > 2000 {
			s = "..." + s[len(s)-2000:]
		}
		fmt.Fprintf(&b, "\n--- %s ---\n%s", filepath.Base(p), s)
	}
	return b.String()
}

func removeIfExists(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// copyImage gives the VM its own disk: a reflink where the filesystem
// supports it (instant, shared blocks), else a full copy, fsynced.
func copyImage(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err != nil {
		// io.Copy between files uses copy_file_range, which keeps the copy
		// in the kernel.
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			os.Remove(dst)
			return err
		}
	}
	if err := out.Sync(); err != nil {
		out.Close()
		os.Remove(dst)
		return err
	}
	return out.Close()
}
