package realch

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/cidata"
	"github.com/vmchaos/vmchaos/cidata/cidatatest"
	"github.com/vmchaos/vmchaos/fakech/guestimg"
	"github.com/vmchaos/vmchaos/stackbin"
	"github.com/vmchaos/vmchaos/vmnet"
	"github.com/vmchaos/vmchaos/vmnet/vmnettest"
)

// fakeRunner is a KVM runner's layout with fakech installed as the binary:
// a bin dir holding cloud-hypervisor, a firmware file and a guest image.
type fakeRunner struct {
	opts   Options
	img    *guestimg.Image
	signer ssh.Signer
	priv   ed25519.PrivateKey
}

func newFakeRunner(t testing.TB) *fakeRunner {
	t.Helper()
	src, err := stackbin.Path("fakech")
	if err != nil {
		t.Fatalf("fakech binary: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin", CHName)
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	imgPath := filepath.Join(dir, "guest.img")
	img, err := guestimg.Build(imgPath, guestimg.Options{
		AuthorizedKeys: []string{strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))},
		Hostname:       "realch-guest",
	})
	if err != nil {
		t.Fatal(err)
	}
	fw := filepath.Join(dir, "CLOUDHV.fd")
	if err := os.WriteFile(fw, []byte("firmware (fakech does not run it)"), 0o644); err != nil {
		t.Fatal(err)
	}
	return &fakeRunner{opts: Options{CHBinary: bin, Firmware: fw, Image: imgPath}, img: img, signer: signer, priv: priv}
}

// guestExec runs cmd in the fake guest over SSH, pinning the image's host key.
func (r *fakeRunner) guestExec(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error), addr, cmd string) (string, error) {
	hostKey, err := r.img.HostPublicKey()
	if err != nil {
		return "", err
	}
	return r.guestExecPinned(ctx, dial, addr, cmd, hostKey)
}

// guestExecPinned is guestExec pinning hostKey (a seed's, once the guest
// took it).
func (r *fakeRunner) guestExecPinned(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error), addr, cmd string, hostKey ssh.PublicKey) (string, error) {
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	cc, chans, reqs, err := ssh.NewClientConn(conn, addr, &ssh.ClientConfig{
		User:            "root",
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(r.signer)},
		HostKeyCallback: ssh.FixedHostKey(hostKey),
	})
	if err != nil {
		conn.Close()
		return "", err
	}
	client := ssh.NewClient(cc, chans, reqs)
	defer client.Close()
	s, err := client.NewSession()
	if err != nil {
		return "", err
	}
	defer s.Close()
	out, err := s.Output(cmd)
	return string(out), err
}

func hostDial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// loopbackIP gives each test process its own guest address in 127/8.
func loopbackIP(last byte) string {
	p := os.Getpid()
	return fmt.Sprintf("127.%d.%d.%d", 100+p%100, (p/100)%250+1, last)
}

func procCmdline(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), nil
}

func launchCleanup(t *testing.T, v *VMM) {
	t.Cleanup(func() {
		if err := v.Stop(context.Background()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
}

func TestLaunchAPIAndTeardownWithFakechAsCloudHypervisor(t *testing.T) {
	r := newFakeRunner(t)
	env, err := Discover(r.opts)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(env.CHVersion, "v5") && !strings.HasPrefix(env.CHVersion, "v4") {
		t.Fatalf("version %q", env.CHVersion)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	guestIP := loopbackIP(2)
	vmDir := filepath.Join(t.TempDir(), "vm1")
	v, err := Launch(ctx, env, LaunchSpec{
		Dir:       vmDir,
		CPUs:      2,
		MemoryMiB: 256,
		NICs:      []vmnet.NIC{{Tap: "vmchaos-tap0", MAC: "52:54:00:12:34:56", IP: guestIP, Mask: "255.0.0.0", ID: "net0"}},
		CloudInit: &cidata.CloudInit{Hostname: "vm1", SSHAuthorizedKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGZha2VrZXk= k"},
			Interfaces: []cidata.GuestInterface{{MAC: "52:54:00:12:34:56", Address: "192.168.249.2/24"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	launchCleanup(t, v)

	// The process is the installed binary, owning this VM's socket: what
	// vmctl's "is this our VMM" check reads.
	argv, err := procCmdline(v.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(argv[0]) != CHName || !strings.Contains(strings.Join(argv, " "), "path="+v.Socket) {
		t.Fatalf("pid %d argv %q", v.Pid, argv)
	}
	// The flags managers use, as the running process got them.
	joined := strings.Join(argv, " ")
	for _, want := range []string{"--console off", "--serial file=" + v.Serial, "--log-file " + v.Log, "--event-monitor path=" + v.Events, "--firmware " + env.Firmware} {
		if !strings.Contains(joined, want) {
			t.Errorf("argv lacks %q: %s", want, joined)
		}
	}

	c := v.Client()
	ping, err := c.Ping(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ping.BuildVersion != env.CHVersion || ping.Pid != int64(v.Pid) {
		t.Fatalf("ping %+v: want build %s pid %d", ping, env.CHVersion, v.Pid)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State != chapi.StateRunning {
		t.Fatalf("state %q", info.State)
	}
	cfg := info.Config
	if cfg.Payload == nil || cfg.Payload.Firmware != env.Firmware {
		t.Errorf("payload %+v", cfg.Payload)
	}
	if cfg.Cpus == nil || cfg.Cpus.BootVcpus != 2 || cfg.Memory == nil || cfg.Memory.Size != 256<<20 {
		t.Errorf("cpus %+v memory %+v", cfg.Cpus, cfg.Memory)
	}
	if len(cfg.Disks) != 2 || cfg.Disks[0].Path != v.Disk || cfg.Disks[1].Path != v.CIData || !cfg.Disks[1].Readonly {
		t.Errorf("disks %+v: want the image copy and the read-only seed", cfg.Disks)
	}
	if len(cfg.Net) != 1 || cfg.Net[0].Tap != "vmchaos-tap0" || cfg.Net[0].Mac != "52:54:00:12:34:56" || cfg.Net[0].IP != guestIP || cfg.Net[0].ID != "net0" {
		t.Errorf("net %+v", cfg.Net)
	}
	if cfg.Serial == nil || !strings.EqualFold(cfg.Serial.Mode, "File") || cfg.Serial.File != v.Serial {
		t.Errorf("serial %+v", cfg.Serial)
	}
	if cfg.Console == nil || !strings.EqualFold(cfg.Console.Mode, "Off") {
		t.Errorf("console %+v", cfg.Console)
	}
	// The disk is a copy, not the runner's image.
	orig, _ := os.ReadFile(env.Image)
	cp, _ := os.ReadFile(v.Disk)
	if !bytes.Equal(orig, cp) || v.Disk == env.Image {
		t.Error("disk is not a byte-for-byte copy of the image")
	}
	if vol, err := cidatatest.ReadFiles(v.CIData); err != nil || !strings.Contains(string(vol["meta-data"]), "local-hostname: \"vm1\"") {
		t.Errorf("seed: %v %q", err, vol["meta-data"])
	}

	// The guest is reachable at the NIC address, with its own host key.
	if out, err := r.guestExec(ctx, hostDial, net.JoinHostPort(guestIP, fmt.Sprint(guestimg.DefaultSSHPort)), "hostname"); err != nil || strings.TrimSpace(out) != "realch-guest" {
		t.Fatalf("guest hostname: %q %v", out, err)
	}

	if err := c.Pause(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := c.Pause(ctx, true); err != nil {
		t.Fatalf("idempotent pause: %v", err)
	}
	if info, _ := c.Info(ctx); info.State != chapi.StatePaused {
		t.Fatalf("after pause: %q", info.State)
	}
	if err := c.Resume(ctx, false); err != nil {
		t.Fatal(err)
	}
	if info, _ := c.Info(ctx); info.State != chapi.StateRunning {
		t.Fatalf("after resume: %q", info.State)
	}

	if err := v.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-v.Done():
	default:
		t.Fatal("Stop returned with the process not reaped")
	}
	if err := v.ExitErr(); err != nil {
		t.Errorf("SIGTERM must end CH gracefully (exit 0): %v", err)
	}
	if err := syscall.Kill(v.Pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("pid %d still exists after Stop: %v", v.Pid, err)
	}
	for _, p := range []string{v.Socket, v.Socket + ".lock", v.Disk, v.CIData} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind: %v", p, err)
		}
	}
	for _, p := range []string{filepath.Join(vmDir, OutName)} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("evidence %s gone: %v", p, err)
		}
	}
	if _, err := r.guestExec(ctx, hostDial, net.JoinHostPort(guestIP, fmt.Sprint(guestimg.DefaultSSHPort)), "hostname"); err == nil {
		t.Error("guest still answers after Stop")
	}
	if err := v.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// wrapCH installs a cloud-hypervisor that prints version for --version and
// otherwise is fakech: what an unsupported release looks like to discovery.
func wrapCH(t *testing.T, fakech, version string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), CHName)
	script := fmt.Sprintf("#!/bin/sh\ncase \"$1\" in --version|-V) echo 'cloud-hypervisor %s'; exit 0;; esac\nexec %q \"$@\"\n", version, fakech)
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLaunchRefusesCloudHypervisorOutsideSupportedRange(t *testing.T) {
	r := newFakeRunner(t)
	for _, ver := range []string{"v39.0", "v54.1"} {
		o := r.opts
		o.CHBinary = wrapCH(t, r.opts.CHBinary, ver)
		env, pr, err := Preflight(o)
		if env != nil || !errors.Is(err, ErrVersion) || pr.Reason != ReasonVersion {
			t.Fatalf("%s: env %v result %+v err %v", ver, env, pr, err)
		}
		want := fmt.Sprintf("%s is cloud-hypervisor %s, outside the supported range v40..v53", o.CHBinary, ver)
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("message %q: want %q", err, want)
		}
		if v := Verdict(o); !strings.Contains(v, "unavailable (ch-version)") || !strings.Contains(v, ver) {
			t.Fatalf("verdict %q", v)
		}
	}
	// The same wrapper at a supported version is accepted and launches.
	o := r.opts
	o.CHBinary = wrapCH(t, r.opts.CHBinary, "v53.0")
	env, err := Discover(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v, err := Launch(ctx, env, LaunchSpec{Dir: filepath.Join(t.TempDir(), "vm")})
	if err != nil {
		t.Fatal(err)
	}
	launchCleanup(t, v)
	if _, err := v.Client().Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

// A VMM that dies before answering ping: Launch reports its output and
// leaves nothing running.
func TestLaunchReportsAVMMThatExitsAtStart(t *testing.T) {
	dir := t.TempDir()
	ch := filepath.Join(dir, CHName)
	script := "#!/bin/sh\ncase \"$1\" in --version) echo 'cloud-hypervisor v51.0'; exit 0;; esac\n" +
		"echo 'Error: Cloud Hypervisor exited with the following chain of errors:' >&2\necho '  0: Failed to create KVM: No such file or directory' >&2\nexit 1\n"
	if err := os.WriteFile(ch, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	img := touch(t, dir, "guest.raw")
	fw := touch(t, dir, "fw")
	env, err := Discover(Options{CHBinary: ch, Firmware: fw, Image: img})
	if err != nil {
		t.Fatal(err)
	}
	vmDir := filepath.Join(dir, "vm")
	v, err := Launch(context.Background(), env, LaunchSpec{Dir: vmDir})
	if err == nil {
		v.Stop(context.Background())
		t.Fatal("Launch succeeded with a VMM that exits")
	}
	for _, want := range []string{"exited before answering vmm.ping", "exit status 1", "Failed to create KVM"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	for _, n := range []string{DiskName, SocketName} {
		if _, err := os.Stat(filepath.Join(vmDir, n)); !os.IsNotExist(err) {
			t.Errorf("%s left behind", n)
		}
	}
}

// A VMM that does not react to SIGTERM (here: stopped) is SIGKILLed after
// the grace period, reaped, and its stale socket removed.
func TestStopEscalatesToSIGKILL(t *testing.T) {
	r := newFakeRunner(t)
	env, err := Discover(r.opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v, err := Launch(ctx, env, LaunchSpec{Dir: filepath.Join(t.TempDir(), "vm"), StopTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	launchCleanup(t, v)
	if err := syscall.Kill(v.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := v.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	var ee interface{ Sys() any }
	if err := v.ExitErr(); !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("exit %v: want killed by SIGKILL", v.ExitErr())
	}
	if _, err := os.Stat(v.Socket); !os.IsNotExist(err) {
		t.Fatalf("socket left after SIGKILL: %v", err)
	}
}

// With a Netns the VMM runs inside it: its guest address exists only there,
// and the pid Launch reports is the VMM itself (ip netns exec execs in place).
func TestLaunchInsideNetns(t *testing.T) {
	vmnettest.NeedNetAdmin(t)
	r := newFakeRunner(t)
	env, err := Discover(r.opts)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := vmnet.NewNetns(vmnettest.UniqueName("vmchaos-l"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Error(err)
		}
	})
	tap := vmnettest.UniqueName("vcl")
	if err := ns.AddTap(tap, "192.168.247.1/24"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := Launch(ctx, env, LaunchSpec{
		Dir:   filepath.Join(t.TempDir(), "vm"),
		Netns: ns,
		NICs:  []vmnet.NIC{{Tap: tap, MAC: "52:54:00:00:00:01", IP: "127.0.0.2", Mask: "255.0.0.0"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Registered after the netns cleanup, so it runs first: the VMM leaves
	// the namespace before the namespace is deleted.
	launchCleanup(t, v)

	argv, err := procCmdline(v.Pid)
	if err != nil || filepath.Base(argv[0]) != CHName {
		t.Fatalf("pid %d argv %q %v: want cloud-hypervisor itself", v.Pid, argv, err)
	}
	mine, _ := os.Readlink("/proc/self/ns/net")
	its, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", v.Pid))
	if err != nil || its == mine {
		t.Fatalf("VMM netns %q, ours %q: want a different one", its, mine)
	}
	addr := net.JoinHostPort("127.0.0.2", fmt.Sprint(guestimg.DefaultSSHPort))
	out, err := r.guestExec(ctx, ns.DialContext, addr, "hostname")
	if err != nil || strings.TrimSpace(out) != "realch-guest" {
		t.Fatalf("guest via the namespace: %q %v", out, err)
	}
	// The same address from the host namespace is not this guest.
	hctx, hcancel := context.WithTimeout(ctx, 5*time.Second)
	defer hcancel()
	if out, err := r.guestExec(hctx, hostDial, addr, "hostname"); err == nil {
		t.Fatalf("host namespace reached the guest: %q", out)
	}
	if err := v.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.ExitErr(); err != nil {
		t.Errorf("exit: %v", err)
	}
}

// A manager that only knows "the cloud-hypervisor binary" (vmctl
// --ch-binary) gets the namespace through the wrapper: discovery reads the
// version through it, and the launched pid is the VMM itself, in the namespace.
func TestCHWrapperRunsTheVMMInsideTheNamespace(t *testing.T) {
	vmnettest.NeedNetAdmin(t)
	r := newFakeRunner(t)
	ns, err := vmnet.NewNetns(vmnettest.UniqueName("vmchaos-w"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Error(err)
		}
	})
	wrapper, err := ns.WriteCHWrapper(t.TempDir(), r.opts.CHBinary)
	if err != nil {
		t.Fatal(err)
	}
	o := r.opts
	o.CHBinary = wrapper
	env, err := Discover(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v, err := Launch(ctx, env, LaunchSpec{Dir: filepath.Join(t.TempDir(), "vm"), NICs: []vmnet.NIC{{IP: "127.0.0.3", Mask: "255.0.0.0"}}})
	if err != nil {
		t.Fatal(err)
	}
	launchCleanup(t, v)
	argv, err := procCmdline(v.Pid)
	if err != nil || argv[0] != r.opts.CHBinary {
		t.Fatalf("pid %d argv %q %v: want the real binary %s", v.Pid, argv, err, r.opts.CHBinary)
	}
	mine, _ := os.Readlink("/proc/self/ns/net")
	its, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", v.Pid))
	if its == mine {
		t.Fatal("the VMM runs in the host namespace")
	}
	out, err := r.guestExec(ctx, ns.DialContext, net.JoinHostPort("127.0.0.3", fmt.Sprint(guestimg.DefaultSSHPort)), "hostname")
	if err != nil || strings.TrimSpace(out) != "realch-guest" {
		t.Fatalf("guest via the namespace: %q %v", out, err)
	}
}
