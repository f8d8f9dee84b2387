package vmnet

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// needNetAdmin skips tests that create namespaces and devices when this
// process cannot (not root, or no iproute2 / tun).
func needNetAdmin(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("netns and TAP setup need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("iproute2 (ip) not installed")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("no /dev/net/tun: TAP devices unavailable")
	}
}

// uniqueName is short enough for interface names (15 bytes) and unique per
// test process, so parallel runs of the suite never collide.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s%d", prefix, os.Getpid()%100000)
}

func ipOut(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestNetnsTapSetupAndTeardownLeavesNothing(t *testing.T) {
	needNetAdmin(t)
	name := uniqueName("vmchaos-t")
	tap := uniqueName("vct")
	hostLinksBefore := ipOut(t, "-o", "link", "show")

	ns, err := NewNetns(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	if _, err := NewNetns(name); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("second NewNetns(%s): %v; want a refusal", name, err)
	}
	if err := ns.AddTap(tap, "192.168.249.1/24"); err != nil {
		t.Fatal(err)
	}

	if !strings.Contains(ipOut(t, "netns", "list"), name) {
		t.Fatalf("netns %s not listed", name)
	}
	inside := ipOut(t, "-n", name, "-d", "link", "show", tap)
	if !strings.Contains(inside, "tun type tap") || !strings.Contains(inside, "UP") {
		t.Fatalf("inside the namespace: %s", inside)
	}
	if addr := ipOut(t, "-n", name, "addr", "show", tap); !strings.Contains(addr, "inet 192.168.249.1/24") {
		t.Fatalf("tap address: %s", addr)
	}
	if out, err := exec.Command("ip", "link", "show", tap).CombinedOutput(); err == nil {
		t.Fatalf("tap %s visible in the host namespace: %s", tap, out)
	}

	if err := ns.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ns.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if strings.Contains(ipOut(t, "netns", "list"), name) {
		t.Fatalf("netns %s still listed after Close", name)
	}
	if _, err := os.Stat(filepath.Join(netnsRun, name)); !os.IsNotExist(err) {
		t.Fatalf("%s/%s still there: %v", netnsRun, name, err)
	}
	if after := ipOut(t, "-o", "link", "show"); linkNames(after) != linkNames(hostLinksBefore) {
		t.Fatalf("host links changed:\nbefore %s\nafter  %s", linkNames(hostLinksBefore), linkNames(after))
	}
	if err := ns.AddTap("late", ""); err == nil {
		t.Fatal("AddTap after Close must fail")
	}
}

// linkNames reduces `ip -o link show` to its interface names.
func linkNames(out string) string {
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) > 1 {
			names = append(names, strings.TrimSuffix(f[1], ":"))
		}
	}
	return strings.Join(names, " ")
}

// A socket made through Do lives in the namespace: a listener there is
// reachable by a dial from the namespace and not from the host.
func TestNetnsDialReachesOnlyInsideTheNamespace(t *testing.T) {
	needNetAdmin(t)
	ns, err := NewNetns(uniqueName("vmchaos-d"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Error(err)
		}
	})
	tap := uniqueName("vcd")
	if err := ns.AddTap(tap, "192.168.248.1/24"); err != nil {
		t.Fatal(err)
	}
	// The tap's address exists only in the namespace, as a guest-side TAP
	// address does on a KVM runner.
	l, err := ns.Listen("tcp", "192.168.248.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "hello from the namespace\n")
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := ns.DialContext(ctx, "tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	c.Close()
	if string(b) != "hello from the namespace\n" {
		t.Fatalf("read %q", b)
	}
	hctx, hcancel := context.WithTimeout(ctx, 2*time.Second)
	defer hcancel()
	var d net.Dialer
	if hc, err := d.DialContext(hctx, "tcp", l.Addr().String()); err == nil {
		hc.Close()
		t.Fatalf("host namespace reached %s: the listener is not isolated", l.Addr())
	}
	// And the goroutine's thread went back: a host-side listener still works.
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl.Close()
}

func TestNetnsRefusesBadNames(t *testing.T) {
	for _, n := range []string{"", "../etc", "a b", strings.Repeat("x", 65)} {
		if _, err := NewNetns(n); err == nil {
			t.Errorf("NewNetns(%q) accepted", n)
		}
	}
	ns := &Netns{Name: "unused"}
	for _, tap := range []string{"", "sixteen-chars-xx", "a/b"} {
		if err := ns.AddTap(tap, ""); err == nil || !strings.Contains(err.Error(), "interface name") {
			t.Errorf("AddTap(%q): %v", tap, err)
		}
	}
	if err := ns.AddTap("ok0", "not-a-cidr"); err == nil {
		t.Error("bad CIDR accepted")
	}
}
