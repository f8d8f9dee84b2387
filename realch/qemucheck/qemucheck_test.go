package qemucheck

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/vmnet"
)

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The emulator's argv: TCG (never KVM), a cache mode where the guest's
// flush is the host's, the seed read-only, the NIC on the run's TAP.
func TestQEMUArgsBootTheImageUnderTCGWithADurableDisk(t *testing.T) {
	s := vmSpec{QEMU: "qemu", Kernel: "/k", Initramfs: "/i", Cmdline: "console=ttyS0 root=/dev/vda1 rw",
		Disk: "/w/disk.raw", DiskCache: "none", Seed: "/w/seed.img", MemoryMiB: 1024, CPUs: 1, Serial: "/w/serial.log",
		NIC: vmnet.NIC{Tap: "qctap0", MAC: "52:54:00:1f:fe:02"}}
	a := strings.Join(s.args(), " ")
	for _, want := range []string{
		"-accel tcg", "-kernel /k -initrd /i -append console=ttyS0 root=/dev/vda1 rw",
		"file=/w/disk.raw,if=none,id=disk0,format=raw,cache=none",
		"file=/w/seed.img,if=none,id=seed0,format=raw,readonly=on",
		"tap,id=net0,ifname=qctap0,script=no,downscript=no", "mac=52:54:00:1f:fe:02",
		"-serial file:/w/serial.log", "-no-reboot",
	} {
		if !strings.Contains(a, want) {
			t.Errorf("argv lacks %q:\n%s", want, a)
		}
	}
	if strings.Contains(a, "kvm") {
		t.Errorf("argv asks for KVM: %s", a)
	}
}

// The milestones are found in a real serial log (escapes and all), and a
// log cut before userspace has none past the kernel.
func TestSerialMilestonesFromARealBoot(t *testing.T) {
	dir := t.TempDir()
	log := readTestdata(t, "serial-dhcp.log")
	v := &vm{spec: vmSpec{Serial: filepath.Join(dir, "serial.log")}, seen: map[string]seen{}, started: time.Now()}
	if err := os.WriteFile(v.spec.Serial, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	v.readSerial(0, "")
	for _, m := range milestones {
		if _, ok := v.Seen(m.Name); !ok {
			t.Errorf("milestone %s not found", m.Name)
		}
	}
	if s, _ := v.Seen("initramfs"); !strings.Contains(s.Line, "Run /init as init process") {
		t.Errorf("initramfs line %q", s.Line)
	}

	cut := log[:strings.Index(log, "Run /init")]
	w := &vm{spec: vmSpec{Serial: filepath.Join(dir, "cut.log")}, seen: map[string]seen{}, started: time.Now()}
	if err := os.WriteFile(w.spec.Serial, []byte(cut), 0o644); err != nil {
		t.Fatal(err)
	}
	w.readSerial(0, "")
	if _, ok := w.Seen("kernel"); !ok {
		t.Error("kernel line not found in the cut log")
	}
	for _, n := range []string{"initramfs", "systemd"} {
		if _, ok := w.Seen(n); ok {
			t.Errorf("milestone %s found in a log that never reached it", n)
		}
	}
}

// A milestone split across two reads (QEMU writes the console as it goes)
// is still found once its line is complete.
func TestSerialMilestoneSplitAcrossReads(t *testing.T) {
	p := filepath.Join(t.TempDir(), "serial.log")
	v := &vm{spec: vmSpec{Serial: p}, seen: map[string]seen{}, started: time.Now()}
	if err := os.WriteFile(p, []byte("[    8.6] Run /in"), 0o644); err != nil {
		t.Fatal(err)
	}
	off, partial := v.readSerial(0, "")
	f, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("it as init process\r\n")
	f.Close()
	v.readSerial(off, partial)
	if _, ok := v.Seen("initramfs"); !ok {
		t.Error("split line not found")
	}
}

func TestParseLeasesTakesTheLastLease(t *testing.T) {
	l, ok := parseLeases(readTestdata(t, "dhclient.leases"))
	if !ok || !leaseFrom(l, "172.31.254.2", "172.31.254.1") || l.Seconds != "86400" {
		t.Fatalf("lease %+v %v", l, ok)
	}
	if leaseFrom(l, "172.31.254.2", "172.31.254.5") || leaseFrom(l, "172.31.254.6", "172.31.254.1") {
		t.Error("a lease from another server or for another address was accepted")
	}
	if _, ok := parseLeases("lease {\n  interface \"eth0\";\n"); ok {
		t.Error("an unterminated lease was taken")
	}
	if _, ok := parseLeases(""); ok {
		t.Error("no lease file, yet a lease")
	}
}

// judgeSeed fails each way a guest can ignore its seed.
func TestJudgeSeedFailsOnEveryMismatch(t *testing.T) {
	want := seedWant{Hostname: "h", HostKey: "ssh-ed25519 AAAA", CIDR: "172.31.254.2/30", Router: "172.31.254.1"}
	dhcp := map[string]string{"hostname": "h", "hostkey": "ssh-ed25519 AAAA", "seed": "active", "keys": "1",
		"addr":  "2: eth0 inet 172.31.254.2/30 brd 172.31.254.3 scope global dynamic eth0 valid_lft 86383sec preferred_lft 86383sec",
		"route": "default via 172.31.254.1 dev eth0", "dhclient": "1"}
	if bad := judgeSeed(want, dhcp); len(bad) != 0 {
		t.Fatalf("a guest that took its DHCP seed: %v", bad)
	}
	static := maps(dhcp, "addr", "2: eth0 inet 172.31.254.2/30 scope global eth0 valid_lft forever preferred_lft forever", "dhclient", "0")
	ws := want
	ws.Static = true
	if bad := judgeSeed(ws, static); len(bad) != 0 {
		t.Fatalf("a guest that took its static seed: %v", bad)
	}
	for name, c := range map[string]struct {
		w  seedWant
		kv map[string]string
	}{
		"hostname":            {want, maps(dhcp, "hostname", "vmchaos")},
		"image's host key":    {want, maps(dhcp, "hostkey", "ssh-ed25519 BBBB")},
		"seed unit failed":    {want, maps(dhcp, "seed", "failed")},
		"no authorized key":   {want, maps(dhcp, "keys", "0")},
		"no address":          {want, maps(dhcp, "addr", "")},
		"DHCP but permanent":  {want, static},
		"static but a lease":  {ws, dhcp},
		"static, dhclient up": {ws, maps(static, "dhclient", "1")},
		"static, no route":    {ws, maps(static, "route", "")},
	} {
		if bad := judgeSeed(c.w, c.kv); len(bad) == 0 {
			t.Errorf("%s: passed", name)
		}
	}
}

func maps(m map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

func TestParseMBRAndLsP(t *testing.T) {
	off, err := parseMBR([]byte(readTestdata(t, "mbr.bin")))
	if err != nil || off != 1<<20 {
		t.Fatalf("offset %d, %v: want 1 MiB (vmchaos image real)", off, err)
	}
	if _, err := parseMBR(make([]byte, 512)); err == nil {
		t.Error("no signature, yet an offset")
	}
	empty := make([]byte, 512)
	empty[510], empty[511] = 0x55, 0xaa
	if _, err := parseMBR(empty); err == nil {
		t.Error("an empty partition table, yet an offset")
	}
	names := parseLsP(readTestdata(t, "debugfs-ls-p.txt"))
	if !slices.Equal(names[:3], []string{"seq-1", "seq-2", "seq-3"}) {
		t.Errorf("debugfs names %v", names)
	}
}

// The kill -9 verdict is the ledger's cut rule with the kill as the pause:
// a listing that lacks a marker acked before the kill fails, one that only
// lacks markers never acked passes.
func TestKillCutFailsOnAnAckedMarkerMissing(t *testing.T) {
	acks := []ledger.WorkloadAck{{Seq: 1, HostNs: 10}, {Seq: 2, HostNs: 20}, {Seq: 3, HostNs: 30}}
	in := ledger.CutInput{Source: guestName, Target: guestName, Acks: acks, First: 1,
		Window: ledger.CutWindow{Snapshot: "kill -9", PauseNs: 35}}
	in.Disk = []string{"seq-1", "seq-2", "seq-3", "seq-4"}
	if v := ledger.ClassifyCut(in); !v.OK {
		t.Fatalf("all acked markers there, one more (fsynced, ack lost with the kill): %s", v.Message)
	}
	in.Disk = []string{"seq-1", "seq-3"}
	if v := ledger.ClassifyCut(in); v.OK || len(v.Lost) != 1 {
		t.Fatalf("acked seq-2 missing: %s", v.Message)
	}
}

func TestPlainDropsConsoleEscapes(t *testing.T) {
	if got := plain("Welcome to \x1b[1mDebian GNU/Linux 12 (bookworm)\x1b[0m!\r"); got != "Welcome to Debian GNU/Linux 12 (bookworm)!" {
		t.Errorf("%q", got)
	}
}

// The whole check against the real image: nightly (make image-check). It
// boots the guest twice under TCG, 4 to 6.5 minutes on two cores.
func TestImageCheckBootsTheRealImage(t *testing.T) {
	if os.Getenv(EnvRun) != "1" {
		t.Skipf("not run by default: two boots of the real image under QEMU/TCG take 4-6.5 min on two cores; set %s=1 (make image-check runs the same check)", EnvRun)
	}
	o := Options{Log: testWriter{t}}
	if m := Missing(o); m != "" {
		t.Skipf("missing for the image check: %s", m)
	}
	rep, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("failed: %v", rep.Failed())
	}
	var names []string
	for _, c := range rep.Checks {
		names = append(names, c.Name)
	}
	for _, want := range []string{"userspace-dhcp", "ssh-dhcp", "seed-dhcp", "ssh-host-key", "dhcp-lease", "dhclient-release",
		"kill-9", "userspace-static", "ssh-static", "seed-static", "kill-9-cut", "writer", "clean-shutdown", "acked-on-image"} {
		if !slices.Contains(names, want) {
			t.Errorf("check %s did not run (ran: %v)", want, names)
		}
	}
	for _, b := range rep.Boots {
		t.Logf("FIGURE boot %s under TCG: userspace %.1fs, SSH %.1fs", b.Seed, b.Userspace.Seconds(), b.SSH.Seconds())
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// FuzzParseGuestOutput feeds the parsers of what the guest and e2fsprogs
// print: none panics, and what they return holds to their contracts.
func FuzzParseGuestOutput(f *testing.F) {
	f.Add(readTestdataF(f, "dhclient.leases"), "172.31.254.2/30")
	f.Add(readTestdataF(f, "debugfs-ls-p.txt"), "")
	f.Add("hostname=h\naddr=2: eth0 inet 1.2.3.4/30 valid_lft forever\n", "1.2.3.4/30")
	f.Add(readTestdataF(f, "mbr.bin"), "")
	f.Fuzz(func(t *testing.T, s, cidr string) {
		if l, ok := parseLeases(s); ok && strings.Contains(l.Address, "\n") {
			t.Errorf("lease address %q spans lines", l.Address)
		}
		for _, n := range parseLsP(s) {
			if n == "" || n == "." || n == ".." || strings.Contains(n, "/") {
				t.Errorf("listing name %q", n)
			}
		}
		for k := range parseKV(s) {
			if strings.Contains(k, "\n") {
				t.Errorf("key %q spans lines", k)
			}
		}
		if a, ok := parseAddr(s, cidr); ok && a.CIDR != cidr {
			t.Errorf("found %q for %q", a.CIDR, cidr)
		}
		if off, err := parseMBR([]byte(s)); err == nil && (off <= 0 || off%512 != 0) {
			t.Errorf("partition offset %d", off)
		}
	})
}

func readTestdataF(f *testing.F, name string) string {
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		f.Fatal(err)
	}
	return string(b)
}
