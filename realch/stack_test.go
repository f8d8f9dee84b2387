package realch

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmchaos/vmchaos/cidata/cidatatest"
	"github.com/vmchaos/vmchaos/stackbin"
	"github.com/vmchaos/vmchaos/vmnet"
	"github.com/vmchaos/vmchaos/vmnet/vmnettest"
)

// stackVM is the part of `vmctl vm inspect -o json` these tests read.
type stackVM struct {
	ID      string `json:"id"`
	Pid     int    `json:"pid"`
	Network []struct {
		IP      string `json:"ip"`
		MAC     string `json:"mac"`
		Mask    string `json:"mask"`
		SSHPort int    `json:"ssh_port"`
		Tap     string `json:"tap"`
		HostIP  string `json:"host_ip"`
	} `json:"network"`
}

// vmctlWith runs the real vmctl with the stack's variables and a private
// root; it fails the test on a non-zero exit.
func vmctlWith(t *testing.T, vars []string, root string, args ...string) string {
	t.Helper()
	out, errOut, err := vmctlRun(t, vars, root, args...)
	if err != nil {
		t.Fatalf("vmctl %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	return out
}

func vmctlRun(t *testing.T, vars []string, root string, args ...string) (string, string, error) {
	t.Helper()
	bin, err := stackbin.Path("vmctl")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(append(os.Environ(), "VMCTL_ROOT_DIR="+root, "VMCHAOS_TIME_SCALE=0.05"), vars...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// runStackVM boots one VM through vmctl with the stack's environment and
// removes it (VMM included) when the test ends.
func runStackVM(t *testing.T, st *Stack, name string) (*stackVM, string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	var v stackVM
	out := vmctlWith(t, st.Vars, root, "vm", "run", "--name", name, st.Image, "-o", "json")
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Cleanup(func() {
		if _, e, err := vmctlRun(t, st.Vars, root, "vm", "rm", "--force", v.ID); err != nil && !strings.Contains(e, "vm not found") {
			t.Errorf("cleanup: vm rm: %v: %s", err, e)
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", v.Pid)); err == nil && v.Pid > 0 {
			if argv, _ := procCmdline(v.Pid); len(argv) > 0 && filepath.Base(argv[0]) == CHName {
				t.Errorf("VMM %d still running after vm rm", v.Pid)
			}
		}
	})
	if len(v.Network) != 1 {
		t.Fatalf("vm %s network %+v", name, v.Network)
	}
	return &v, root
}

func pubKey(r *fakeRunner) string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(r.signer.PublicKey())))
}

// stackPool is a /24 in 127/8 of this test process: fakech only accepts
// loopback for ip= (on real CH it is the TAP's host side).
func stackPool() string {
	p := os.Getpid()
	return fmt.Sprintf("127.%d.%d.0/24", 100+p%100, (p/100)%250+1)
}

// TestStackEnvPointsVMCtlAtTheRealBackend: StackEnv's variables make the
// real vmctl boot the discovered binary (fakech installed as
// cloud-hypervisor) with the discovered firmware, a TAP per NIC carrying
// the host side, the cloud-init seed with the given key, and record the
// guest's address.
func TestStackEnvPointsVMCtlAtTheRealBackend(t *testing.T) {
	r := newFakeRunner(t)
	key := pubKey(r)
	pool := stackPool()
	st, err := StackEnv(StackOptions{Options: r.opts, SeedPubKey: key, Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	})
	want := []string{
		"VMCTL_CH_BINARY=" + r.opts.CHBinary, "VMCTL_NET_MODE=tap", "VMCTL_NET_POOL=" + pool,
		"VMCTL_SEED_PUBKEY=" + key, "VMCTL_FIRMWARE=" + r.opts.Firmware,
	}
	if !reflect.DeepEqual(st.Vars, want) || st.Image != r.opts.Image || st.Netns != nil || st.Dial == nil {
		t.Fatalf("stack %+v\nwant vars %q", st, want)
	}

	v, root := runStackVM(t, st, "g1")
	n := v.Network[0]
	argv, err := procCmdline(v.Pid)
	if err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(root, "vms", v.ID, CIDataName)
	for _, w := range []string{
		"--firmware", r.opts.Firmware,
		"path=" + seed + ",readonly=on",
		"tap=" + n.Tap + ",mac=" + n.MAC + ",ip=" + n.HostIP + ",mask=255.255.255.252,id=n" + strings.ReplaceAll(n.MAC, ":", ""), // vmctl names NICs after their MAC
	} {
		if !slices.Contains(argv, w) {
			t.Fatalf("VMM argv lacks %q: %q", w, argv)
		}
	}
	if argv[0] != r.opts.CHBinary {
		t.Fatalf("VMM argv[0] %s, want %s", argv[0], r.opts.CHBinary)
	}
	// The guest address is vmnet.PlanNIC's guest side of the NIC's /30.
	_, gi, guest, err := vmnet.PlanNIC(pool, slotIn(t, pool, n.IP), n.Tap)
	if err != nil || guest != n.IP || gi.MAC != n.MAC || gi.Gateway != n.HostIP {
		t.Fatalf("NIC %+v does not follow vmnet.PlanNIC (%s %+v %v)", n, guest, gi, err)
	}
	files, err := cidatatest.ReadFiles(seed)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(files["user-data"]), key) || !strings.Contains(string(files["network-config"]), n.IP+"/30") {
		t.Fatalf("seed:\n%s\n%s", files["user-data"], files["network-config"])
	}
}

// slotIn is the /30 slot of guest address ip in pool.
func slotIn(t *testing.T, pool, ip string) int {
	t.Helper()
	_, pn, _ := net.ParseCIDR(pool)
	g := net.ParseIP(ip).To4()
	b := pn.IP.To4()
	off := int(g[2]-b[2])<<8 | int(g[3]-b[3])
	return off / 4
}

// TestStackEnvRunsVMMsInItsNamespace: with Netns, StackEnv creates the
// namespace and a wrapper; vmctl's VMMs run inside it (argv[0] still the
// real binary, so vmctl's identity check holds), Stack.Dial reaches what
// listens there while the host namespace cannot, and Close leaves no
// namespace or wrapper behind.
func TestStackEnvRunsVMMsInItsNamespace(t *testing.T) {
	vmnettest.NeedNetAdmin(t)
	r := newFakeRunner(t)
	name := vmnettest.UniqueName("vmchaos-s")
	dir := t.TempDir()
	st, err := StackEnv(StackOptions{Options: r.opts, SeedPubKey: pubKey(r), Pool: stackPool(), Netns: name, Dir: dir, DHCP: true})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = st.Close()
		}
	})
	wrapper := filepath.Join(dir, CHName)
	if !slices.Contains(st.Vars, "VMCTL_CH_BINARY="+wrapper) || !slices.Contains(st.Vars, "VMCTL_NETNS="+name) ||
		!slices.Contains(st.Vars, "VMCTL_GUEST_NET=dhcp") || st.Netns == nil || st.DHCP == nil {
		t.Fatalf("vars %q", st.Vars)
	}

	v, root := runStackVM(t, st, "g2")
	argv, err := procCmdline(v.Pid)
	if err != nil || argv[0] != r.opts.CHBinary {
		t.Fatalf("VMM %d argv %q %v: want the real binary %s", v.Pid, argv, err, r.opts.CHBinary)
	}
	its, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", v.Pid))
	var want syscall.Stat_t
	if err := syscall.Stat(filepath.Join("/run/netns", name), &want); err != nil {
		t.Fatal(err)
	}
	if its != "net:["+strconv.FormatUint(want.Ino, 10)+"]" {
		t.Fatalf("VMM in %s, want the stack's namespace (inode %d)", its, want.Ino)
	}
	// The fake guest answers on the guest address vmctl planned (from its
	// MAC, as a real guest takes it by DHCP), inside the namespace: it is
	// reachable through the stack's dialer only.
	n := v.Network[0]
	addr := net.JoinHostPort(n.IP, strconv.Itoa(n.SSHPort))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The guest took its host key from the seed vmctl wrote: vmctl's key.
	hk, err := os.ReadFile(filepath.Join(root, "vms", v.ID, "ssh_host_ed25519_key"))
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.ParsePrivateKey(hk)
	if err != nil {
		t.Fatal(err)
	}
	out, err := r.guestExecPinned(ctx, st.Dial, addr, "hostname", signer.PublicKey())
	if err != nil || strings.TrimSpace(out) != "realch-guest" {
		t.Fatalf("through the namespace: %q %v", out, err)
	}
	if c, err := hostDial(ctx, "tcp", addr); err == nil {
		c.Close()
		t.Fatalf("%s reachable from the host namespace", addr)
	}
	// vmctl's vm exec dials the guest address from the namespace too
	// (VMCTL_NETNS).
	keyFile := filepath.Join(t.TempDir(), "id_ed25519")
	blk, err := ssh.MarshalPrivateKey(r.priv, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(blk), 0o600); err != nil {
		t.Fatal(err)
	}
	vars := append(slices.Clone(st.Vars), "VMCTL_SSH_KEY="+keyFile)
	if out := vmctlWith(t, vars, root, "vm", "exec", v.ID, "--", "hostname"); strings.TrimSpace(out) != "realch-guest" {
		t.Fatalf("vm exec through --netns: %q", out)
	}

	// DHCP: the seed asks for it, and on the VM's TAP (created here as CH
	// would, from tap= with the host side from ip=) the responder hands out
	// exactly the guest address vmctl recorded.
	files, err := cidatatest.ReadFiles(filepath.Join(root, "vms", v.ID, CIDataName))
	if err != nil || !strings.Contains(string(files["network-config"]), "dhcp4: true") {
		t.Fatalf("seed network-config %q %v", files["network-config"], err)
	}
	if err := st.Netns.AddTap(n.Tap, n.HostIP+"/30"); err != nil {
		t.Fatal(err)
	}
	// The pool is in 127/8 for fakech's sake; on a TAP such addresses are
	// martian unless route_localnet allows them (a real pool needs nothing).
	if out, err := st.Netns.Command(context.Background(), "sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1", "net.ipv4.conf."+n.Tap+".route_localnet=1").CombinedOutput(); err != nil {
		t.Fatalf("route_localnet: %v: %s", err, out)
	}
	end := vmnettest.OpenTapEnd(t, st.Netns, n.Tap)
	mac, _ := net.ParseMAC(n.MAC)
	disc := &vmnet.DHCPPacket{Op: 1, XID: 0x1234abcd, CHAddr: mac, Options: map[byte][]byte{53: {vmnet.DHCPDiscover}}}
	if offer, _ := vmnettest.Exchange(t, end, disc.Marshal(), vmnet.ParseDHCP); offer.MsgType() != vmnet.DHCPOffer || offer.YIAddr.String() != n.IP {
		t.Fatalf("DHCP on %s offered %+v, vmctl recorded %s", n.Tap, offer, n.IP)
	}
	end.Close()

	vmctlWith(t, st.Vars, root, "vm", "rm", "--force", v.ID)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	if _, err := os.Stat(filepath.Join("/run/netns", name)); err == nil {
		t.Fatalf("namespace %s left behind", name)
	}
	if _, err := os.Stat(wrapper); err == nil {
		t.Fatal("wrapper left behind")
	}
}

func TestStackEnvRefusesBadInput(t *testing.T) {
	r := newFakeRunner(t)
	for _, c := range []struct {
		o    StackOptions
		want string
	}{
		{StackOptions{Options: r.opts}, "SeedPubKey"},
		{StackOptions{Options: r.opts, SeedPubKey: "a\nb"}, "SeedPubKey"},
		{StackOptions{Options: r.opts, SeedPubKey: pubKey(r), Pool: "10.0.0.0/31"}, "pool"},
		{StackOptions{Options: r.opts, SeedPubKey: pubKey(r), Netns: "x"}, "Dir is required"},
		{StackOptions{Options: Options{CHBinary: filepath.Join(t.TempDir(), "nope"), Firmware: r.opts.Firmware, Image: r.opts.Image}, SeedPubKey: pubKey(r)}, "missing"},
	} {
		if _, err := StackEnv(c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("StackEnv(%+v): %v, want %q", c.o, err, c.want)
		}
	}
}

// TestStackEnvKernelBoot: a kernel payload becomes VMCTL_KERNEL (and the
// initramfs and command line) instead of VMCTL_FIRMWARE.
func TestStackEnvKernelBoot(t *testing.T) {
	r := newFakeRunner(t)
	d := t.TempDir()
	kern, initrd := filepath.Join(d, "vmlinux"), filepath.Join(d, "initrd")
	for _, p := range []string{kern, initrd} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	o := r.opts
	o.Firmware, o.Kernel, o.Initramfs = "", kern, initrd
	t.Setenv(EnvFirmware, "")
	st, err := StackEnv(StackOptions{Options: o, SeedPubKey: pubKey(r), Cmdline: "console=hvc0 root=/dev/vda1"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, w := range []string{"VMCTL_KERNEL=" + kern, "VMCTL_INITRAMFS=" + initrd, "VMCTL_CMDLINE=console=hvc0 root=/dev/vda1", "VMCTL_NET_POOL=" + vmnet.DefaultTapPool} {
		if !slices.Contains(st.Vars, w) {
			t.Fatalf("vars %q lack %q", st.Vars, w)
		}
	}
	if slices.ContainsFunc(st.Vars, func(s string) bool { return strings.HasPrefix(s, "VMCTL_FIRMWARE=") }) {
		t.Fatalf("vars %q: firmware with a kernel boot", st.Vars)
	}
}
