package vmctl

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmchaos/vmchaos/chapi"
)

const testSeedKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGm9lW0kz1ZxJ3n3m0k0fU1n0Hq8V1oQ0k3Yq8b1cQ0x run@vmchaos"

func newTapManager(t *testing.T, pool string, extra func(*Config)) *Manager {
	t.Helper()
	cfg := Config{RootDir: t.TempDir(), NetMode: NetModeTap, NetPool: pool, SeedPubKey: testSeedKey, Firmware: "/fw/CLOUDHV.fd"}
	if extra != nil {
		extra(&cfg)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// reserveFor reserves a placeholder named name with n NICs and releases its
// ops lock.
func reserveFor(t *testing.T, m *Manager, name string, n int, prefer []NIC) *VM {
	t.Helper()
	rec, ops, err := m.reserve(context.Background(), name, VMConfig{CPU: 2, Memory: 1 << 30, NICs: n, Image: "/img/guest.raw"}, prefer)
	if err != nil {
		t.Fatal(err)
	}
	ops.Unlock()
	return rec
}

// checkTapNIC asserts one NIC follows vmnet.PlanNIC inside pool: guest .2
// and host .1 of one /30, the TAP named after that /30, the MAC after the
// guest address.
func checkTapNIC(t *testing.T, pool string, i int, n NIC) {
	t.Helper()
	g := netip.MustParseAddr(n.IP)
	if !netip.MustParsePrefix(pool).Contains(g) {
		t.Fatalf("nic %d: guest %s outside pool %s", i, n.IP, pool)
	}
	u := binary.BigEndian.Uint32(g.AsSlice())
	var hb [4]byte
	binary.BigEndian.PutUint32(hb[:], u-1)
	mac := fmt.Sprintf("52:54:00:%02x:%02x:%02x", g.As4()[1], g.As4()[2], g.As4()[3])
	want := NIC{
		ID:      "n" + strings.ReplaceAll(mac, ":", ""), // named after the MAC: unique across CH's device tree
		MAC:     mac,
		IP:      n.IP,
		Mask:    "255.255.255.252",
		SSHPort: 22,
		Tap:     fmt.Sprintf("vt%08x", u-2),
		HostIP:  netip.AddrFrom4(hb).String(),
	}
	if u%4 != 2 || n != want {
		t.Fatalf("nic %d:\n got %+v\nwant %+v", i, n, want)
	}
}

// TestTapBootArgv: in tap mode a cold boot passes each NIC as
// tap=,mac=,ip=<host side>,mask=,id=, attaches the seed as a second
// read-only disk and sends the serial console to a file; the record keeps
// the guest's address (port 22).
func TestTapBootArgv(t *testing.T) {
	pool := "172.30.0.0/16"
	m := newTapManager(t, pool, nil)
	v := reserveFor(t, m, "web", 2, nil)
	if len(v.Network) != 2 {
		t.Fatalf("network %+v", v.Network)
	}
	for i, n := range v.Network {
		checkTapNIC(t, pool, i, n)
	}
	if v.Network[0].IP == v.Network[1].IP {
		t.Fatal("two NICs share a /30")
	}
	if got := v.GuestAddress(); got != v.Network[0].IP+":22" {
		t.Fatalf("guest address %s", got)
	}
	want := []string{
		"--firmware", "/fw/CLOUDHV.fd",
		"--cpus", "boot=2",
		"--memory", "size=1024M",
		"--disk", "path=" + m.vmDisk(v.ID), "path=" + filepath.Join(m.vmDir(v.ID), "cidata.img") + ",readonly=on",
	}
	for _, n := range v.Network {
		want = append(want, "--net", "tap="+n.Tap+",mac="+n.MAC+",ip="+n.HostIP+",mask=255.255.255.252,id="+n.ID)
	}
	want = append(want, "--serial", "file="+filepath.Join(m.vmRunDir(v.ID), "serial.log"), "--console", "off")
	if got := m.bootArgs(v); !reflect.DeepEqual(got, want) {
		t.Fatalf("argv:\n got %q\nwant %q", got, want)
	}

	// A kernel boot replaces --firmware with --kernel/--cmdline/--initramfs.
	mk := newTapManager(t, pool, func(c *Config) { c.Kernel, c.Initramfs = "/k/vmlinux", "/k/initrd" })
	vk := reserveFor(t, mk, "k", 1, nil)
	got := mk.bootArgs(vk)
	if !reflect.DeepEqual(got[:6], []string{"--kernel", "/k/vmlinux", "--cmdline", "console=ttyS0 root=/dev/vda1 rw", "--initramfs", "/k/initrd"}) || slices.Contains(got, "--firmware") {
		t.Fatalf("kernel argv %q", got)
	}
}

// TestFakeBootArgvUnchanged pins the fake mode's argv byte for byte: the
// seed as a second, read-only disk as for every guest, no tap, no serial
// file, --net id=,mac=,ip=<guest>,mask=.
func TestFakeBootArgvUnchanged(t *testing.T) {
	m, err := New(Config{RootDir: t.TempDir(), NetPool: "127.66.5.0/24", Firmware: "/fw"})
	if err != nil {
		t.Fatal(err)
	}
	v := reserveFor(t, m, "f", 1, nil)
	n := v.Network[0]
	if n.Tap != "" || n.HostIP != "" {
		t.Fatalf("fake NIC %+v", n)
	}
	want := []string{"--firmware", "/fw", "--cpus", "boot=2", "--memory", "size=1024M", "--disk", "path=" + m.vmDisk(v.ID),
		"path=" + m.vmSeed(v.ID) + ",readonly=on", "--net", "id=" + n.ID + ",mac=" + n.MAC + ",ip=" + n.IP + ",mask=255.255.255.0"}
	if got := m.bootArgs(v); !reflect.DeepEqual(got, want) {
		t.Fatalf("argv:\n got %q\nwant %q", got, want)
	}
	b, _ := json.Marshal(n)
	if strings.Contains(string(b), "tap") || strings.Contains(string(b), "host_ip") {
		t.Fatalf("fake NIC JSON grew fields: %s", b)
	}
}

// TestTapSlotsStableByName: the same name gets the same TAP, addresses and
// MAC after its VM is deleted (a hibernate) and re-created (a wake); another
// name never gets them; a second store given the first store's NICs as the
// snapshot's record (an imported snapshot) reuses them even where its own
// choice would differ.
func TestTapSlotsStableByName(t *testing.T) {
	pool := "10.9.0.0/24" // 64 slots: small enough to make probing matter
	m := newTapManager(t, pool, nil)
	hashSlot := func(name string) uint32 {
		h := fnv.New32a()
		h.Write([]byte(name + "/0"))
		return h.Sum32() % 64
	}
	// A name hashing to a's first slot takes it first, so a's first NIC is
	// probed elsewhere: the second store must follow the snapshot, not the
	// hash.
	collider := ""
	for i := 0; collider == ""; i++ {
		if c := fmt.Sprintf("c%d", i); hashSlot(c) == hashSlot("a") {
			collider = c
		}
	}
	reserveFor(t, m, collider, 1, nil)
	a := reserveFor(t, m, "a", 2, nil)
	if s, _ := m.slotOf(a.Network[0].IP); uint32(s) == hashSlot("a") {
		t.Fatalf("a got the slot %s holds", collider)
	}
	ctx := context.Background()
	l, err := m.opsLock(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.deleteVM(ctx, a.ID, "test"); err != nil {
		t.Fatal(err)
	}
	l.Unlock()
	seen := map[string]string{a.Network[0].IP: "a", a.Network[1].IP: "a"}
	for i := range 20 {
		n := fmt.Sprintf("other-%d", i)
		o := reserveFor(t, m, n, 1, nil)
		if who, dup := seen[o.Network[0].IP]; dup {
			t.Fatalf("%s got %s, held by %s", n, o.Network[0].IP, who)
		}
		seen[o.Network[0].IP] = n
	}
	again := reserveFor(t, m, "a", 2, nil)
	if !reflect.DeepEqual(again.Network, a.Network) {
		t.Fatalf("name a after delete:\n got %+v\nwant %+v", again.Network, a.Network)
	}
	// Fewer NICs: a prefix of the same plan.
	if s, err := m.tapSlots(mustLoad(t, m), "a", 1, nil); err != nil || len(s) != 1 {
		t.Fatalf("slots %v %v", s, err)
	}

	m2 := newTapManager(t, pool, nil)
	imp := reserveFor(t, m2, "a", 2, a.Network)
	if !reflect.DeepEqual(imp.Network, a.Network) {
		t.Fatalf("name a in a second store with the snapshot's NICs:\n got %+v\nwant %+v", imp.Network, a.Network)
	}
	m3 := newTapManager(t, pool, nil)
	if own := reserveFor(t, m3, "a", 1, nil); own.Network[0] == a.Network[0] {
		t.Fatal("without the snapshot's NICs a third store chose the same slot: the test proves nothing")
	}
}

func mustLoad(t *testing.T, m *Manager) *vmIndex {
	t.Helper()
	ix, err := m.loadVMs()
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

// seedFiles renders the cloud-init seed m would attach to v's cold boot.
func seedFiles(t *testing.T, m *Manager, v *VM) map[string][]byte {
	t.Helper()
	ci, err := m.seedConfig(v)
	if err != nil {
		t.Fatal(err)
	}
	files, err := ci.Files()
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestTapSeedCarriesKeyAndAddress: the seed authorizes the key, names the
// host after the VM and configures the guest address by MAC with the host
// side as the gateway; the key may also come from a .pub file.
func TestTapSeedCarriesKeyAndAddress(t *testing.T) {
	pub := filepath.Join(t.TempDir(), "id.pub")
	if err := os.WriteFile(pub, []byte(testSeedKey+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := newTapManager(t, "172.30.0.0/16", func(c *Config) { c.SeedPubKey = pub })
	v := reserveFor(t, m, "Web_01", 1, nil)
	files := seedFiles(t, m, v)
	n := v.Network[0]
	for f, want := range map[string][]string{
		"user-data":      {`"` + testSeedKey + `"`, "disable_root: false", `hostname: "web-01"`},
		"meta-data":      {`instance-id: "vmchaos-web-01"`},
		"network-config": {`macaddress: "` + n.MAC + `"`, `addresses: ["` + n.IP + `/30"]`, `via: "` + n.HostIP + `"`},
	} {
		for _, w := range want {
			if !strings.Contains(string(files[f]), w) {
				t.Errorf("%s lacks %s:\n%s", f, w, files[f])
			}
		}
	}
	if err := m.writeSeed(v); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(m.vmSeed(v.ID)); err != nil || fi.Size() == 0 {
		t.Fatalf("seed file: %v", err)
	}
	// Without a key the seed still hands the guest its pinned host key.
	m.cfg.SeedPubKey = ""
	ud := string(seedFiles(t, m, v)["user-data"])
	if strings.Contains(ud, "ssh_authorized_keys") || !strings.Contains(ud, "ed25519_private") {
		t.Fatalf("no key: user-data\n%s", ud)
	}
}

func TestNetModeRefusesUnknown(t *testing.T) {
	if _, err := New(Config{RootDir: t.TempDir(), NetMode: "bridge"}); err == nil || !strings.Contains(err.Error(), "--net-mode") {
		t.Fatalf("got %v", err)
	}
}

// vmmArgv reads the live VMM's command line.
func vmmArgv(t *testing.T, v *VM) []string {
	t.Helper()
	argv := readCmdline(v.Pid)
	if len(argv) == 0 {
		t.Fatalf("VMM %d of %s: no command line", v.Pid, v.ID)
	}
	return argv
}

func vmmInfo(t *testing.T, v *VM) chapi.VmInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info, err := chapi.New(filepath.Join(v.RunDir, "api.sock")).Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func decodeVM(t *testing.T, out string) *VM {
	t.Helper()
	var v VM
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return &v
}

// TestTapModeEndToEnd runs the real vmctl in tap mode with fakech as
// cloud-hypervisor (which takes tap= and, being fake, answers at the guest
// address its seed gives the MAC; this checks argv, records and the VMM's
// config, not SSH): a cold boot with the seed,
// a hibernate-shaped cycle (NIC drop, save, rm, clone under the same name)
// that comes back on the same TAP, address and MAC, a clone under another
// name that does not, and a wake in a second store from an exported
// snapshot that does.
func TestTapModeEndToEnd(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	sp, _ := ssh.NewPublicKey(priv.Public())
	key := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))
	s := newStack(t, "0.05", "VMCTL_NET_MODE=tap", "VMCTL_SEED_PUBKEY="+key)
	var pool string
	for _, e := range s.env {
		if p, ok := strings.CutPrefix(e, "VMCTL_NET_POOL="); ok {
			pool = p
		}
	}

	a := decodeVM(t, s.ok("vm", "run", "--name", "a", s.image, "-o", "json"))
	if len(a.Network) != 1 {
		t.Fatalf("network %+v", a.Network)
	}
	n := a.Network[0]
	checkTapNIC(t, pool, 0, n)
	n = a.Network[0]
	argv := vmmArgv(t, a)
	seed := filepath.Join(s.root, "vms", a.ID, "cidata.img")
	wantNet := "tap=" + n.Tap + ",mac=" + n.MAC + ",ip=" + n.HostIP + ",mask=255.255.255.252,id=" + n.ID
	for _, w := range []string{"path=" + seed + ",readonly=on", wantNet, "--serial", "--console"} {
		if !slices.Contains(argv, w) {
			t.Fatalf("VMM argv lacks %q: %q", w, argv)
		}
	}
	if fi, err := os.Stat(seed); err != nil || fi.Size() == 0 {
		t.Fatalf("seed: %v", err)
	}
	info := vmmInfo(t, a)
	if len(info.Config.Net) != 1 || info.Config.Net[0].Tap != n.Tap || info.Config.Net[0].IP != n.HostIP {
		t.Fatalf("VMM net config %+v", info.Config.Net)
	}
	if len(info.Config.Disks) != 2 || info.Config.Disks[1].Path != seed || !info.Config.Disks[1].Readonly {
		t.Fatalf("VMM disks %+v", info.Config.Disks)
	}

	// Hibernate as the agent does it, then wake under the same name.
	s.ok("vm", "net", "a", "--nics", "0")
	if got := s.vm("a").Network; len(got) != 0 {
		t.Fatalf("after nics 0: %+v", got)
	}
	s.ok("snapshot", "save", "--name", "a-hib", "a")
	// The NIC was dropped before the save, yet the metadata carries the
	// name's plan (what a wake in another store follows).
	var snap Snapshot
	if err := json.Unmarshal([]byte(s.ok("snapshot", "inspect", "a-hib", "-o", "json")), &snap); err != nil {
		t.Fatal(err)
	}
	meta, err := readMeta(snap.Dir)
	if err != nil || meta.SourceName != "a" || !reflect.DeepEqual(meta.NICs, a.Network) {
		t.Fatalf("snapshot metadata %+v %v, want source a with %+v", meta, err, a.Network)
	}
	s.ok("vm", "rm", "--force", "a")
	w := decodeVM(t, s.ok("vm", "clone", "--name", "a", "--nics", "1", "a-hib", "-o", "json"))
	if !reflect.DeepEqual(w.Network, a.Network) {
		t.Fatalf("woken a:\n got %+v\nwant %+v", w.Network, a.Network)
	}
	wargv := vmmArgv(t, w)
	if slices.ContainsFunc(wargv, func(s string) bool { return strings.Contains(s, "tap=") }) {
		t.Fatalf("clone VMM started with NICs (want --api-socket only): %q", wargv)
	}
	winfo := vmmInfo(t, w)
	wseed := filepath.Join(s.root, "vms", w.ID, "cidata.img")
	if len(winfo.Config.Net) != 1 || winfo.Config.Net[0].Tap != n.Tap || winfo.Config.Net[0].IP != n.HostIP || winfo.Config.Net[0].Mac != n.MAC {
		t.Fatalf("woken VMM net %+v", winfo.Config.Net)
	}
	if len(winfo.Config.Disks) != 2 || winfo.Config.Disks[1].Path != wseed {
		t.Fatalf("woken VMM disks %+v (want the seed at %s)", winfo.Config.Disks, wseed)
	}
	if _, err := os.Stat(wseed); err != nil {
		t.Fatalf("clone seed: %v", err)
	}

	// Another name from the same snapshot gets its own slot.
	b := decodeVM(t, s.ok("vm", "clone", "--name", "b", "a-hib", "--nics", "1", "-o", "json"))
	if len(b.Network) != 1 || b.Network[0].IP == n.IP || b.Network[0].Tap == n.Tap {
		t.Fatalf("b %+v shares a's slot %+v", b.Network, n)
	}
	s.check()

	// A wake in another store (the registry pull path): export, import,
	// clone under the same name.
	tarPath := filepath.Join(t.TempDir(), "a-hib.tar")
	s.ok("snapshot", "export", "a-hib", "-o", tarPath)
	s2 := newStack(t, "0.05", "VMCTL_NET_MODE=tap", "VMCTL_SEED_PUBKEY="+key, "VMCTL_NET_POOL="+pool)
	s2.ok("snapshot", "import", tarPath)
	s.ok("vm", "rm", "--force", "a", "b") // frees the fake guest's listener on a's guest address
	w2 := decodeVM(t, s2.ok("vm", "clone", "--name", "a", "--nics", "1", "a-hib", "-o", "json"))
	if !reflect.DeepEqual(w2.Network, a.Network) {
		t.Fatalf("a woken in a second store:\n got %+v\nwant %+v", w2.Network, a.Network)
	}
	s2.check()
}

// FuzzRewriteConfig: config.json comes from a snapshot, possibly imported
// from elsewhere. Whatever it holds, rewriteConfig never panics, and what it
// accepts comes back as JSON whose first disk is the clone's, with no NICs,
// and whose seed (if it reports one) is the clone's.
func FuzzRewriteConfig(f *testing.F) {
	f.Add([]byte(`{"disks":[{"path":"/a/disk.img"}],"net":[{"ip":"127.0.0.2"}]}`))
	f.Add([]byte(`{"disks":[{"path":"/a/disk.img"},{"path":"/a/cidata.img","readonly":true}]}`))
	f.Add([]byte(`{"disks":[{"path":"/a/disk.img"},7]}`))
	f.Add([]byte(`{"disks":[{"path":"/a/disk.img"},{"path":5}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		out, hasSeed, err := rewriteConfig(b, "/c/disk.img", "/c/cidata.img")
		if err != nil {
			return
		}
		var cfg struct {
			Disks []map[string]any `json:"disks"`
			Net   any              `json:"net"`
		}
		if err := json.Unmarshal(out, &cfg); err != nil {
			t.Fatalf("output is not JSON: %v: %s", err, out)
		}
		if len(cfg.Disks) == 0 || cfg.Disks[0]["path"] != "/c/disk.img" || cfg.Net != nil {
			t.Fatalf("output %s", out)
		}
		seen := false
		for _, d := range cfg.Disks[1:] {
			if p, _ := d["path"].(string); filepath.Base(p) == seedFile {
				if p != "/c/cidata.img" {
					t.Fatalf("seed left at %s: %s", p, out)
				}
				seen = true
			}
		}
		if seen != hasSeed {
			t.Fatalf("reported seed %v, output %s", hasSeed, out)
		}
	})
}

// TestTapSeedDHCP: with --guest-net dhcp the seed pins no address (DHCP on
// every ethernet device); an unknown mode is refused.
func TestTapSeedDHCP(t *testing.T) {
	m := newTapManager(t, "172.30.0.0/16", func(c *Config) { c.GuestNet = GuestNetDHCP })
	v := reserveFor(t, m, "d", 1, nil)
	files := seedFiles(t, m, v)
	nc := string(files["network-config"])
	if !strings.Contains(nc, "dhcp4: true") || strings.Contains(nc, v.Network[0].IP) || strings.Contains(nc, "macaddress") {
		t.Fatalf("network-config:\n%s", nc)
	}
	if _, err := New(Config{RootDir: t.TempDir(), GuestNet: "slaac"}); err == nil || !strings.Contains(err.Error(), "--guest-net") {
		t.Fatalf("got %v", err)
	}
}
