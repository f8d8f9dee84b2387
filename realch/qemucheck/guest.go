package qemucheck

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/vmchaos/vmchaos/ledger"
)

// guestReport prints what the seed checks read, one key=value a line.
const guestReport = `echo "hostname=$(hostname)"
echo "hostkey=$(cut -d' ' -f1,2 /etc/ssh/ssh_host_ed25519_key.pub)"
echo "seed=$(systemctl is-active vmchaos-seed.service)"
echo "keys=$(grep -c . /root/.ssh/authorized_keys)"
echo "addr=$(ip -4 -o addr show dev eth0 | tr -s ' \\' ' ')"
echo "route=$(ip -4 route show default)"
echo "dhclient=$(pgrep -c dhclient)"
echo "kernel=$(uname -r)"`

// bootDHCP is the first boot: the DHCP seed, then the seed, pin, lease and
// RELEASE checks, then the writer and a kill -9 of QEMU.
func (c *checker) bootDHCP(ctx context.Context) bool {
	seed, err := c.seed("dhcp", hostDHCP, false)
	if err != nil {
		return c.record("seed-dhcp", false, "write the seed: %v", err)
	}
	v, ok := c.boot(ctx, "dhcp", seed)
	if !ok {
		return false
	}
	kv, ok := c.checkSeed(ctx, "dhcp", hostDHCP)
	ok = c.checkPin(ctx) && ok
	ok = c.checkLease(ctx, kv) && ok
	ok = c.checkRelease(ctx) && ok
	if !ok {
		_ = v.kill()
		return false
	}
	return c.writeAndKill(ctx, v)
}

// bootStatic is the second boot, from the disk the kill -9 left: the static
// seed, the cut the kill left judged from inside the guest, a second writer
// session, a clean shutdown, and the cut judged on the image file.
func (c *checker) bootStatic(ctx context.Context) bool {
	seed, err := c.seed("static", hostStatic, true)
	if err != nil {
		return c.record("seed-static", false, "write the seed: %v", err)
	}
	v, ok := c.boot(ctx, "static", seed)
	if !ok {
		return false
	}
	_, ok = c.checkSeed(ctx, "static", hostStatic)
	ok = c.checkCutAfterKill(ctx, v) && ok
	if !ok {
		_ = v.kill()
		return false
	}
	return c.writeAndShutdown(ctx, v)
}

// checkSeed: the guest took its hostname, root's key and its host key from
// this boot's seed, and its network config (DHCP: an expiring address;
// static: the planned address for good, the route, no dhclient).
func (c *checker) checkSeed(ctx context.Context, name, hostname string) (map[string]string, bool) {
	out, err := c.led.Exec(ctx, c.g, guestReport)
	if err != nil {
		return nil, c.record("seed-"+name, false, "guest report: %v", err)
	}
	kv := parseKV(out)
	bad := judgeSeed(seedWant{Static: name == "static", Hostname: hostname,
		HostKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(c.hostPub))), CIDR: c.guestIP + "/30", Router: c.nic.IP}, kv)
	if len(bad) > 0 {
		return kv, c.record("seed-"+name, false, "%s", strings.Join(bad, "; "))
	}
	return kv, c.record("seed-"+name, true, "kernel %s; hostname %s, root's authorized key the run's, host key %s (the seed's), vmchaos-seed active; eth0 %q, route %q, dhclient processes %s",
		kv["kernel"], kv["hostname"], ssh.FingerprintSHA256(c.hostPub), kv["addr"], kv["route"], kv["dhclient"])
}

// seedWant is what a boot's seed asked for.
type seedWant struct {
	Static   bool
	Hostname string
	HostKey  string // "ssh-ed25519 AAAA…"
	CIDR     string // the guest's address on eth0
	Router   string // the TAP's host side
}

// judgeSeed compares the guest's report (guestReport) with the seed and
// lists what differs.
func judgeSeed(w seedWant, kv map[string]string) []string {
	var bad []string
	if kv["hostname"] != w.Hostname {
		bad = append(bad, fmt.Sprintf("hostname %q, want %q", kv["hostname"], w.Hostname))
	}
	if kv["hostkey"] != w.HostKey {
		bad = append(bad, fmt.Sprintf("host key %q is not the seed's", kv["hostkey"]))
	}
	if kv["seed"] != "active" || kv["keys"] != "1" {
		bad = append(bad, fmt.Sprintf("vmchaos-seed.service %q, authorized keys %q (want active, 1)", kv["seed"], kv["keys"]))
	}
	a, found := parseAddr(kv["addr"], w.CIDR)
	switch {
	case !found:
		bad = append(bad, fmt.Sprintf("eth0 has no %s: %q", w.CIDR, kv["addr"]))
	case w.Static && (!a.Forever || kv["dhclient"] != "0" || !strings.HasPrefix(kv["route"], "default via "+w.Router+" dev eth0")):
		bad = append(bad, fmt.Sprintf("static config: address %q, route %q, %s dhclient running (want valid_lft forever, default via %s, none)", kv["addr"], kv["route"], kv["dhclient"], w.Router))
	case !w.Static && a.Forever:
		bad = append(bad, fmt.Sprintf("DHCP config: address %q never expires: not a lease", kv["addr"]))
	}
	return bad
}

// checkPin: SSH went through the pins file that already held the seed's
// host key (no first-contact pin was added), and a pins file holding any
// other key is refused by the real sshd's handshake.
func (c *checker) checkPin(ctx context.Context) bool {
	now, err := os.ReadFile(c.pins)
	if err != nil {
		return c.record("ssh-host-key", false, "read %s: %v", c.pins, err)
	}
	if !bytes.Equal(now, c.pinned) {
		return c.record("ssh-host-key", false, "the pins file changed after the first contact (a key was pinned on first use, not from the seed): %q", now)
	}
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	os2, _ := ssh.NewSignerFromKey(other)
	wrong := filepath.Join(c.dir, "pins-wrong")
	if err := os.WriteFile(wrong, []byte(knownhosts.Line([]string{guestName}, os2.PublicKey())+"\n"), 0o644); err != nil {
		return c.record("ssh-host-key", false, "%v", err)
	}
	l2, err := ledger.Open(filepath.Join(c.dir, "journal-wrong.jsonl"), c.key, wrong)
	if err != nil {
		return c.record("ssh-host-key", false, "%v", err)
	}
	l2.Dial, l2.AttemptTimeout = c.led.Dial, c.led.AttemptTimeout
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	_, err = l2.Exec(wctx, c.g, "true")
	if !errors.Is(err, ledger.ErrHostKeyChanged) {
		return c.record("ssh-host-key", false, "a pin of another key (%s) was not refused: %v", ssh.FingerprintSHA256(os2.PublicKey()), err)
	}
	return c.record("ssh-host-key", true, "sshd at %s offered %s, pinned from the seed before first contact (pins file unchanged); a pin of %s was refused: %s",
		c.g.Addr, ssh.FingerprintSHA256(c.hostPub), ssh.FingerprintSHA256(os2.PublicKey()), clip(err.Error(), 90))
}

// checkLease: the harness's responder answered (OFFER and ACK at least),
// and the guest's dhclient holds its lease: the planned address from the
// TAP's host side, which is also its router.
func (c *checker) checkLease(ctx context.Context, kv map[string]string) bool {
	out, err := c.led.Exec(ctx, c.g, "cat /var/lib/dhcp/dhclient.leases")
	if err != nil {
		return c.record("dhcp-lease", false, "read the guest's lease file: %v", err)
	}
	l, found := parseLeases(out)
	n, rerr := c.dhcp.Answers(), c.dhcp.Err()
	ok := found && leaseFrom(l, c.guestIP, c.nic.IP) && n >= 2 && rerr == nil
	return c.record("dhcp-lease", ok, "responder in %s sent %d answers (err %v); guest dhclient.leases: interface %s fixed-address %s server %s router %s lease %ss (want eth0 %s from %s)",
		c.ns.Name, n, rerr, l.Interface, l.Address, l.Server, l.Router, l.Seconds, c.guestIP, c.nic.IP)
}

// leaseFrom: the lease is eth0's, for guest, from host (server and router).
func leaseFrom(l lease, guest, host string) bool {
	return l.Interface == "eth0" && l.Address == guest && l.Server == host && l.Router == host
}

// checkRelease: `dhclient -r`, as the agent runs it over SSH before it
// drops the NIC, answers on the session that ran it, and the address stays
// (the image's enter hook); Debian's own script would flush it and the
// session would never get its exit status.
func (c *checker) checkRelease(ctx context.Context) bool {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	start := time.Now()
	out, err := c.led.Exec(rctx, c.g, "dhclient -r && ip -4 -o addr show dev eth0")
	if err != nil {
		return c.record("dhclient-release", false, "`dhclient -r` over SSH: %v", err)
	}
	cidr := c.guestIP + "/30"
	if _, found := parseAddr(out, cidr); !found {
		return c.record("dhclient-release", false, "after `dhclient -r` eth0 lost %s: %q", cidr, out)
	}
	again, err := c.led.Exec(rctx, c.g, "ip -4 -o addr show dev eth0 | tr -s ' \\\\' ' '")
	if err != nil {
		return c.record("dhclient-release", false, "a new SSH connection after `dhclient -r`: %v", err)
	}
	return c.record("dhclient-release", true, "`dhclient -r` answered on its own session in %s and eth0 kept %s; a new connection still reaches it: %q",
		time.Since(start).Round(time.Millisecond), cidr, strings.TrimSpace(again))
}
