package fakech_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/cidata"
	"github.com/vmchaos/vmchaos/internal/needs"
	"github.com/vmchaos/vmchaos/vmnet"
)

// TestTapOnlyNICTakesItsAddressFromTheMAC: a NIC given as tap=,mac= without
// ip= makes the fake guest answer on 127.B3.B4.B5 (the MAC's last bytes), as
// vmctl's tap plan derives the MAC from the guest address.
func TestTapOnlyNICTakesItsAddressFromTheMAC(t *testing.T) {
	dir := vmDir(t, "VMTAP")
	g := newGuest(t, dir)
	sock := filepath.Join(dir, "api.sock")
	b := byte(1 + mrandN(250))
	mac := fmt.Sprintf("52:54:00:7e:%02x:%02x", b, b+1)
	startReady(t, sock, baseEnv(), "--api-socket", "path="+sock, "--firmware", "/nonexistent", "--disk", "path="+g.path,
		"--console", "off", "--serial", "null", "--net", "tap=vtfake0,mac="+mac)
	ip := fmt.Sprintf("127.126.%d.%d", b, b+1)
	if out, _, st := g.sshRun(t, ip, "hostname"); st != 0 || strings.TrimSpace(out) == "" {
		t.Fatalf("guest on a TAP-only NIC at %s: status %d %q", ip, st, out)
	}
}

func mrandN(n int) int { return rand.IntN(n) }

// TestTapNICWithHostSideAnswersAtTheGuestAddress: vmctl's tap mode passes
// tap=,mac= and ip= the host side of the TAP (CH configures the TAP with
// it); the guest is not there but at the address its MAC derives, where a
// real guest configures itself, and nothing answers on the host side.
func TestTapNICWithHostSideAnswersAtTheGuestAddress(t *testing.T) {
	dir := vmDir(t, "VMTAPH")
	g := newGuest(t, dir)
	sock := filepath.Join(dir, "api.sock")
	b := byte(1 + mrandN(250))
	mac := fmt.Sprintf("52:54:00:7b:%02x:06", b)
	host := fmt.Sprintf("127.123.%d.5", b)
	startReady(t, sock, baseEnv(), "--api-socket", "path="+sock, "--firmware", "/nonexistent", "--disk", "path="+g.path,
		"--console", "off", "--serial", "null", "--net", "tap=vtfake3,mac="+mac+",ip="+host+",mask=255.255.255.252")
	ip := fmt.Sprintf("127.123.%d.6", b)
	if out, _, st := g.sshRun(t, ip, "hostname"); st != 0 || strings.TrimSpace(out) == "" {
		t.Fatalf("guest at %s (from its MAC): status %d %q", ip, st, out)
	}
	if conn, err := net.DialTimeout("tcp", net.JoinHostPort(host, fmt.Sprint(g.img.SSHPort)), time.Second); err == nil {
		conn.Close()
		t.Fatalf("the host side %s answers: the guest must answer at its own address", host)
	}
}

// TestTapOnlyNICAnswersInsideTheVMMsNetns: run inside a network namespace
// (as realch runs CH), the guest of a TAP-only NIC listens in that
// namespace: a harness dialing from inside it gets the SSH banner, the host
// namespace does not see it.
func TestTapOnlyNICAnswersInsideTheVMMsNetns(t *testing.T) {
	tapNICInNetns(t, "fktap", false, "vtfake1", "52:54:00:7d:01:02", "127.125.1.2")
}

// TestTapOnlyNICAnswersInANetnsWithLoDown: cocoon's CNI provider starts
// each VMM in a netns of its own, made with netns.NewNamed, whose lo is
// down (network/cni/create_linux.go); a real guest has its own lo, the fake
// one shares the VMM's. The guest must still answer inside that namespace
// (fakech brings its lo up), not fail the boot with "cannot assign
// requested address".
func TestTapOnlyNICAnswersInANetnsWithLoDown(t *testing.T) {
	tapNICInNetns(t, "fklo", true, "vtfake2", "52:54:00:7d:01:03", "127.125.1.3")
}

// tapNICInNetns runs fakech with a TAP-only NIC inside a fresh network
// namespace (lo down when loDown) and wants the SSH banner at ip from
// inside it, and nothing at ip from the host namespace.
func tapNICInNetns(t *testing.T, prefix string, loDown bool, tap, mac, ip string) {
	needs.Root(t, "creating a network namespace")
	var ns *vmnet.Netns
	name := fmt.Sprintf("%s%d", prefix, rand.IntN(1e6))
	if loDown {
		// as netns.NewNamed leaves it: lo never up, so not even
		// 127.0.0.1 is assigned (vmnet.NewNetns brings lo up)
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			t.Skipf("no network namespace here: %v: %s", err, out)
		}
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
		var err error
		if ns, err = vmnet.OpenNetns(name); err != nil {
			t.Fatal(err)
		}
	} else {
		var err error
		if ns, err = vmnet.NewNetns(name); err != nil {
			t.Skipf("no network namespace here: %v", err)
		}
		t.Cleanup(func() { _ = ns.Close() })
	}
	dir := vmDir(t, "VM"+strings.ToUpper(prefix))
	g := newGuest(t, dir)
	sock := filepath.Join(dir, "api.sock")
	cmd := ns.Command(context.Background(), fakechBin, "--api-socket", "path="+sock, "--firmware", "/nonexistent",
		"--disk", "path="+g.path, "--console", "off", "--serial", "null", "--net", "tap="+tap+",mac="+mac)
	cmd.Env = baseEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := chapi.New(sock)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitVM(ctx); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(ip, fmt.Sprint(g.img.SSHPort))
	banner := ""
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && !strings.HasPrefix(banner, "SSH-2.0-"); {
		conn, err := ns.DialContext(ctx, "tcp", addr)
		if err == nil {
			_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
			banner, _ = bufio.NewReader(conn).ReadString('\n')
			conn.Close()
		}
		if !strings.HasPrefix(banner, "SSH-2.0-") {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if !strings.HasPrefix(banner, "SSH-2.0-") {
		t.Fatalf("no SSH banner from %s inside netns %s (got %q)", addr, ns.Name, banner)
	}
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Fatalf("%s answers in the host namespace too: the guest must live in the VMM's", addr)
	}
}

// TestTapOnlyNICTakesItsAddressFromTheSeed: with a cloud-init NoCloud seed
// disk (as realch writes it) giving the NIC's MAC a static loopback address,
// the fake guest answers there rather than at the MAC-derived one.
func TestTapOnlyNICTakesItsAddressFromTheSeed(t *testing.T) {
	dir := vmDir(t, "VMSEED")
	g := newGuest(t, dir)
	b := byte(1 + mrandN(250))
	mac := fmt.Sprintf("52:54:00:7c:%02x:01", b)
	ip := fmt.Sprintf("127.124.%d.9", b)
	seed := filepath.Join(dir, "cidata.img")
	if err := cidata.BuildCIData(seed, cidata.CloudInit{Hostname: "seeded", SSHAuthorizedKeys: []string{"ssh-ed25519 AAAA test"},
		Interfaces: []cidata.GuestInterface{{MAC: mac, Address: ip + "/30"}}}); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "api.sock")
	startReady(t, sock, baseEnv(), "--api-socket", "path="+sock, "--firmware", "/nonexistent",
		"--disk", "path="+g.path, "path="+seed+",readonly=on", "--console", "off", "--serial", "null", "--net", "tap=vtfake2,mac="+mac)
	if out, _, st := g.sshRun(t, ip, "hostname"); st != 0 || strings.TrimSpace(out) == "" {
		t.Fatalf("guest at its seed address %s: status %d %q", ip, st, out)
	}
	if conn, err := net.DialTimeout("tcp", net.JoinHostPort(fmt.Sprintf("127.124.%d.1", b), fmt.Sprint(g.img.SSHPort)), time.Second); err == nil {
		conn.Close()
		t.Fatal("the MAC-derived address answers too: the seed must take precedence")
	}
}
