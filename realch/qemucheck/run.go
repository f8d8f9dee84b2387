package qemucheck

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/vmchaos/vmchaos/cidata"
	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/vmnet"
)

// The run's fixed names: one guest, one TAP in a namespace of this run.
const (
	guestName  = "image-check"
	hostDHCP   = "vmchaos-check-dhcp"
	hostStatic = "vmchaos-check-static"
	tapName    = "qctap0"
	// netPool is one /30 inside the run's own namespace: the TAP's host
	// side .1, the guest .2 (vmnet.PlanNIC).
	netPool = "172.31.254.0/30"
)

// checker is one run of the check: its directory, its namespace and DHCP
// responder, its ledger, and the VMs it started.
type checker struct {
	o   Options
	rep *Report

	dir   string
	disk  string
	cache string

	ns      *vmnet.Netns
	dhcp    *vmnet.DHCPResponder
	nic     vmnet.NIC
	gi      cidata.GuestInterface
	guestIP string

	key        *ledger.Key
	hostKeyPEM []byte
	hostPub    ssh.PublicKey
	pins       string
	pinned     []byte // the pins file as the check wrote it
	led        *ledger.Ledger
	g          ledger.Guest

	vms    []*vm
	bootID string // the first boot's
	killNs int64  // the kill -9, on the ledger's clock (failpoint.Now)
}

// Run boots the image twice and runs every check (see the package comment).
// The error is for what kept the check from running at all (ErrMissing, a
// namespace that cannot be made); a guest that fails a check is a failed
// Check in the report, with its evidence, and the checks that depend on it
// are not run.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	if m := Missing(o); m != "" {
		return nil, fmt.Errorf("%w: %s", ErrMissing, m)
	}
	c := &checker{o: o, rep: &Report{}}
	defer c.teardown()
	if err := c.setup(ctx); err != nil {
		return nil, fmt.Errorf("image check: %w", err)
	}
	c.rep.Dir = c.dir
	if c.bootDHCP(ctx) {
		c.bootStatic(ctx)
	}
	return c.rep, nil
}

// record adds a check and prints it: "ok" or "FAIL", its name, its evidence.
func (c *checker) record(name string, ok bool, format string, args ...any) bool {
	ev := fmt.Sprintf(format, args...)
	c.rep.Checks = append(c.rep.Checks, Check{Name: name, OK: ok, Evidence: ev})
	mark := "ok  "
	if !ok {
		mark = "FAIL"
	}
	fmt.Fprintf(c.o.Log, "%s %-16s %s\n", mark, name, ev)
	return ok
}

func (c *checker) step(format string, args ...any) {
	fmt.Fprintf(c.o.Log, "     "+format+"\n", args...)
}

// setup makes the work dir and the disk copy, the keys and the pin, the
// namespace with its TAP and DHCP responder, and the ledger.
func (c *checker) setup(ctx context.Context) error {
	c.dir = c.o.WorkDir
	if c.dir == "" {
		d, err := os.MkdirTemp("/var/tmp", "vmchaos-image-check-")
		if err != nil {
			return err
		}
		c.dir = d
	} else if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return err
	}
	c.disk = filepath.Join(c.dir, "disk.raw")
	start := time.Now()
	if err := copySparse(ctx, c.o.Image, c.disk); err != nil {
		return err
	}
	if _, err := rootPartitionOffset(c.disk); err != nil {
		return err
	}
	c.cache = diskCache(c.disk)
	c.step("image %s copied to %s in %s; disk cache=%s", c.o.Image, c.disk, time.Since(start).Round(time.Millisecond), c.cache)
	if err := c.keys(); err != nil {
		return err
	}
	return c.network()
}

// keys makes the run's login key, the guest's host key the seed carries,
// and a pins file that already holds that host key: the first SSH contact
// must match it (pinned from the seed, not trusted on first use).
func (c *checker) keys() error {
	var err error
	if c.key, err = ledger.NewKey(filepath.Join(c.dir, "key")); err != nil {
		return err
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	blk, err := ssh.MarshalPrivateKey(priv, "vmchaos image check host key")
	if err != nil {
		return err
	}
	c.hostKeyPEM = pem.EncodeToMemory(blk)
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return err
	}
	c.hostPub = signer.PublicKey()
	c.pins = filepath.Join(c.dir, "pins")
	c.pinned = []byte(knownhosts.Line([]string{guestName}, c.hostPub) + " pinned-from=seed\n")
	if err := os.WriteFile(c.pins, c.pinned, 0o644); err != nil {
		return err
	}
	c.led, err = ledger.Open(filepath.Join(c.dir, "journal.jsonl"), c.key, c.pins)
	if err != nil {
		return err
	}
	// One SSH attempt on an emulated CPU: the handshake's crypto runs at
	// TCG speed.
	c.led.AttemptTimeout = 30 * time.Second
	return nil
}

// network makes the run's namespace, its TAP and the DHCP responder.
func (c *checker) network() error {
	var err error
	if c.ns, err = vmnet.NewNetns(fmt.Sprintf("vmchaos-qc%d", os.Getpid())); err != nil {
		return err
	}
	if c.nic, c.gi, c.guestIP, err = vmnet.PlanNIC(netPool, 0, tapName); err != nil {
		return err
	}
	if err := c.ns.AddTap(c.nic.Tap, c.nic.IP+"/30"); err != nil {
		return err
	}
	if c.dhcp, err = vmnet.ServeDHCP(c.ns); err != nil {
		return err
	}
	c.led.Dial = c.ns.DialContext
	c.g = ledger.Guest{Name: guestName, Addr: c.guestIP + ":22"}
	c.step("namespace %s: tap %s %s/30, guest %s mac %s, DHCP responder on :67", c.ns.Name, c.nic.Tap, c.nic.IP, c.guestIP, c.nic.MAC)
	return nil
}

// teardown kills any QEMU still running (by its pid), then stops the
// responder and deletes the namespace; the work dir goes unless Keep.
func (c *checker) teardown() {
	for _, v := range c.vms {
		select {
		case <-v.done:
		default:
			_ = v.kill()
		}
	}
	if c.dhcp != nil {
		_ = c.dhcp.Close()
	}
	if c.ns != nil {
		if err := c.ns.Close(); err != nil {
			fmt.Fprintf(c.o.Log, "     teardown: %v\n", err)
		}
	}
	if c.dir != "" && !c.o.Keep && c.o.WorkDir == "" {
		_ = os.RemoveAll(c.dir)
	}
}

// seed writes one NoCloud seed: the run's key, the pinned host key, and
// DHCP on every NIC (static false) or the planned address by MAC.
func (c *checker) seed(name, hostname string, static bool) (string, error) {
	ci := cidata.CloudInit{
		Hostname:          hostname,
		SSHAuthorizedKeys: []string{c.key.AuthorizedKey()},
		SSHHostKey:        c.hostKeyPEM,
	}
	if static {
		ci.Interfaces = []cidata.GuestInterface{c.gi}
	}
	p := filepath.Join(c.dir, "seed-"+name+".img")
	if err := cidata.BuildCIData(p, ci); err != nil {
		return "", err
	}
	return p, nil
}

// boot starts QEMU with seed and waits for userspace and then SSH. It
// records the boot's timeline; on failure the check is recorded and QEMU
// killed.
func (c *checker) boot(ctx context.Context, name, seed string) (*vm, bool) {
	spec := vmSpec{QEMU: c.o.QEMU, Kernel: c.o.Kernel, Initramfs: c.o.Initramfs, Cmdline: c.o.Cmdline,
		Disk: c.disk, DiskCache: c.cache, Seed: seed, NIC: c.nic, MemoryMiB: c.o.MemoryMiB, CPUs: c.o.CPUs,
		Serial: filepath.Join(c.dir, "serial-"+name+".log")}
	v, err := startVM(c.ns, spec)
	if err != nil {
		return nil, c.record("boot-"+name, false, "%v", err)
	}
	c.vms = append(c.vms, v)
	c.step("boot %s: qemu pid %d: %s %s", name, v.Pid(), spec.QEMU, strings.Join(spec.args(), " "))
	bctx, cancel := context.WithTimeout(ctx, c.o.BootTimeout)
	defer cancel()
	ms := map[string]seen{}
	for _, m := range []string{"kernel", "initramfs", "systemd"} {
		s, err := v.waitMilestone(bctx, m)
		if err != nil {
			_ = v.kill()
			return nil, c.record("userspace-"+name, false, "%v; serial log %s", err, spec.Serial)
		}
		ms[m] = s
	}
	c.record("userspace-"+name, true, "serial console: %q at %.1fs, %q at %.1fs, %q at %.1fs",
		clip(ms["kernel"].Line, 60), secs(ms["kernel"].At), ms["initramfs"].Line, secs(ms["initramfs"].At),
		clip(plain(ms["systemd"].Line), 80), secs(ms["systemd"].At))
	id, err := c.led.Exec(bctx, c.g, "cat /proc/sys/kernel/random/boot_id")
	if err != nil {
		_ = v.kill()
		return nil, c.record("ssh-"+name, false, "no SSH answer from %s: %v", c.g.Addr, err)
	}
	sshAt := time.Since(v.started)
	c.record("ssh-"+name, true, "%s answered as root with the run's key at %.1fs, boot id %s", c.g.Addr, secs(sshAt), strings.TrimSpace(id))
	c.rep.Boots = append(c.rep.Boots, Boot{Seed: name, Kernel: ms["kernel"].At, Userspace: ms["initramfs"].At,
		Systemd: ms["systemd"].At, SSH: sshAt})
	if c.bootID == "" {
		c.bootID = strings.TrimSpace(id)
	}
	return v, true
}

func secs(d time.Duration) float64 { return d.Seconds() }

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
