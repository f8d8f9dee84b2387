package cidata

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/vmchaos/vmchaos/cidata/cidatatest"
	"github.com/vmchaos/vmchaos/internal/needs"
)

func testCloudInit() CloudInit {
	return CloudInit{
		InstanceID:        "vmchaos-run42-vm1",
		Hostname:          "vm1",
		SSHAuthorizedKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGZha2VrZXlmb3J0aGVjaWRhdGF0ZXN0MDAwMDAw vmchaos-run42"},
		Interfaces: []GuestInterface{{
			MAC: "52:54:00:12:34:56", Address: "192.168.249.2/24", Gateway: "192.168.249.1", Nameservers: []string{"192.168.249.1"},
		}},
	}
}

func TestCIDataReadBackByIndependentFATReader(t *testing.T) {
	p := filepath.Join(t.TempDir(), "cidata.img")
	c := testCloudInit()
	if err := BuildCIData(p, c); err != nil {
		t.Fatal(err)
	}
	img, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	vol, err := cidatatest.ReadFAT(img)
	if err != nil {
		t.Fatal(err)
	}
	if vol.BPBLabel != "CIDATA" || vol.RootLabel != "CIDATA" || vol.FSType != "FAT12" {
		t.Fatalf("labels %q/%q type %q", vol.BPBLabel, vol.RootLabel, vol.FSType)
	}
	if len(vol.Files) != 3 {
		t.Fatalf("files %v: want meta-data, user-data, network-config", keys(vol.Files))
	}
	md := string(vol.Files["meta-data"])
	ud := string(vol.Files["user-data"])
	nc := string(vol.Files["network-config"])
	for _, want := range []string{"instance-id: \"vmchaos-run42-vm1\"\n", "local-hostname: \"vm1\"\n"} {
		if !strings.Contains(md, want) {
			t.Errorf("meta-data %q lacks %q", md, want)
		}
	}
	if !strings.HasPrefix(ud, "#cloud-config\n") {
		t.Errorf("user-data must start with #cloud-config: %q", ud)
	}
	for _, want := range []string{"hostname: \"vm1\"\n", "ssh_authorized_keys:\n  - \"" + c.SSHAuthorizedKeys[0] + "\"\n", "disable_root: false\n", "ssh_pwauth: false\n"} {
		if !strings.Contains(ud, want) {
			t.Errorf("user-data %q lacks %q", ud, want)
		}
	}
	for _, want := range []string{"version: 2\n", "macaddress: \"52:54:00:12:34:56\"", "addresses: [\"192.168.249.2/24\"]", "via: \"192.168.249.1\"", "nameservers:"} {
		if !strings.Contains(nc, want) {
			t.Errorf("network-config %q lacks %q", nc, want)
		}
	}
	// The 8.3 aliases must be valid and distinct (a reader without VFAT sees them).
	aliases := map[string]bool{}
	for n, s := range vol.ShortOf {
		if aliases[s] || strings.ContainsAny(s, "abcdefghijklmnopqrstuvwxyz") {
			t.Errorf("%s: alias %q duplicate or lower case", n, s)
		}
		aliases[s] = true
	}
}

// libblkid (what cloud-init's NoCloud source uses to find the seed by label)
// must see a vfat volume labelled CIDATA.
func TestCIDataRecognisedByBlkid(t *testing.T) {
	blkid := needs.Binary(t, "", "blkid", "install util-linux (Debian: apt install util-linux)")
	p := filepath.Join(t.TempDir(), "cidata.img")
	if err := BuildCIData(p, testCloudInit()); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(blkid, "-p", "-o", "export", p).CombinedOutput()
	if err != nil {
		t.Fatalf("blkid: %v: %s", err, out)
	}
	for _, want := range []string{"LABEL=CIDATA", "TYPE=vfat", "VERSION=FAT12"} {
		if !strings.Contains(string(out), want+"\n") {
			t.Errorf("blkid says %q; want %s", out, want)
		}
	}
}

// The kernel's own vfat driver, where it can be mounted (root, loop devices,
// vfat built in): the strongest independent reader there is.
func TestCIDataMountedByKernel(t *testing.T) {
	needs.Root(t, "a loop mount of the seed image")
	fs, _ := os.ReadFile("/proc/filesystems")
	if !strings.Contains(string(fs), "\tvfat\n") {
		t.Skip("missing host feature: this kernel has no vfat driver (/proc/filesystems); the FAT reader and blkid tests cover the format")
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "cidata.img")
	c := testCloudInit()
	if err := BuildCIData(p, c); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop,ro", "-t", "vfat", p, mnt).CombinedOutput(); err != nil {
		t.Skipf("missing host feature: loop mount unavailable here (loop devices, vfat): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount: %v: %s", err, out)
		}
	})
	want, _ := c.Files()
	for name, data := range want {
		got, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s via the kernel: %q %v; want %q", name, got, err, data)
		}
	}
}

func TestBuildFATRoundTripsManyFilesAndSizes(t *testing.T) {
	files := map[string][]byte{
		"empty":               nil,
		"one-byte":            {7},
		"exactly-one-cluster": bytes.Repeat([]byte{1}, fatCluster),
		"cluster-plus-one":    bytes.Repeat([]byte{2}, fatCluster+1),
		"a-rather-long-name-that-needs-three-lfn-entries.txt": bytes.Repeat([]byte("x"), 5000),
		"UPPER.TXT":     []byte("upper"),
		"ünïcode-名前":    []byte("unicode"),
		"same-prefix-1": []byte("1"),
		"same-prefix-2": []byte("2"),
		"big":           bytes.Repeat([]byte("0123456789"), 300_000),
	}
	img, err := BuildFAT("TESTVOL", files)
	if err != nil {
		t.Fatal(err)
	}
	vol, err := cidatatest.ReadFAT(img)
	if err != nil {
		t.Fatal(err)
	}
	if vol.RootLabel != "TESTVOL" {
		t.Fatalf("label %q", vol.RootLabel)
	}
	for n, d := range files {
		if got, ok := vol.Files[n]; !ok || !bytes.Equal(got, d) {
			t.Errorf("%s: got %d bytes (present %v), want %d", n, len(got), ok, len(d))
		}
	}
	if len(vol.Files) != len(files) {
		t.Errorf("read %v", keys(vol.Files))
	}
	again, _ := BuildFAT("TESTVOL", files)
	if !bytes.Equal(img, again) {
		t.Error("the same files must give the same bytes")
	}
}

func TestBuildFATRefusesWhatFAT12CannotHold(t *testing.T) {
	if _, err := BuildFAT("X", map[string][]byte{"huge": make([]byte, 9<<20)}); err == nil {
		t.Error("9 MiB: want an error")
	}
	if _, err := BuildFAT("X", map[string][]byte{"a/b": nil}); err == nil {
		t.Error("slash in name: want an error")
	}
	for _, bad := range []map[string][]byte{
		{"\xd3": nil},                        // not UTF-8: would read back as U+FFFD
		{"trailing.": nil},                   // VFAT drops trailing dots
		{"tab\there": nil},                   // control character
		{"Meta-Data": nil, "meta-data": nil}, // one file to a case-blind lookup
		{strings.Repeat("x", 256): nil},
	} {
		if _, err := BuildFAT("X", bad); err == nil {
			t.Errorf("%q: want an error", keys(bad))
		}
	}
	if _, err := BuildFAT("BAD.LABEL", nil); err == nil {
		t.Error("dot in label: want an error")
	}
	if _, err := BuildFAT("TWELVECHARSX", nil); err == nil {
		t.Error("12-char label: want an error")
	}
}

func TestCloudInitRejectsBadInput(t *testing.T) {
	bad := []func(*CloudInit){
		func(c *CloudInit) { c.Hostname = "bad host" },
		func(c *CloudInit) { c.Hostname = "" },
		func(c *CloudInit) { c.SSHHostKey = []byte("not a key") },
		func(c *CloudInit) { c.SSHAuthorizedKeys = []string{"ssh-ed25519 AAAA\nhostname: evil"} },
		func(c *CloudInit) { c.Interfaces[0].MAC = "52:54:00" },
		func(c *CloudInit) { c.Interfaces[0].Address = "192.168.249.2" },
		func(c *CloudInit) { c.Interfaces[0].Gateway = "gw" },
		func(c *CloudInit) { c.InstanceID = "id with spaces" },
	}
	for i, mutate := range bad {
		c := testCloudInit()
		mutate(&c)
		if _, err := c.Files(); err == nil {
			t.Errorf("case %d: %+v accepted", i, c)
		}
	}
	c := testCloudInit()
	c.Interfaces = nil
	f, err := c.Files()
	if err != nil || !strings.Contains(string(f["network-config"]), "dhcp4: true") {
		t.Fatalf("no interfaces: want DHCP: %q %v", f["network-config"], err)
	}
}

// TestCloudInitHostKey: the host key goes to cloud-init's ssh_keys with its
// public half, replacing the image's keys; without authorized keys the seed
// has no ssh_authorized_keys at all; a key that is not ed25519 is refused.
func TestCloudInitHostKey(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	blk, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	c := testCloudInit()
	c.SSHAuthorizedKeys = nil
	c.SSHHostKey = pem.EncodeToMemory(blk)
	f, err := c.Files()
	if err != nil {
		t.Fatal(err)
	}
	signer, _ := ssh.NewSignerFromKey(priv)
	pub := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
	ud := string(f["user-data"])
	for _, want := range []string{"ssh_deletekeys: true\nssh_keys:\n", "  ed25519_private: " + yamlString(string(c.SSHHostKey)) + "\n", "  ed25519_public: \"" + pub + "\"\n"} {
		if !strings.Contains(ud, want) {
			t.Errorf("user-data lacks %q:\n%s", want, ud)
		}
	}
	if strings.Contains(ud, "ssh_authorized_keys") {
		t.Errorf("no keys, yet:\n%s", ud)
	}
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if blk, err = ssh.MarshalPrivateKey(ec, ""); err != nil {
		t.Fatal(err)
	}
	c.SSHHostKey = pem.EncodeToMemory(blk)
	if _, err := c.Files(); err == nil || !strings.Contains(err.Error(), "want ssh-ed25519") {
		t.Errorf("an ecdsa host key: %v", err)
	}
}

func keys(m map[string][]byte) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	return k
}

// Whatever names and bytes go in, the independent reader gets them back (or
// BuildFAT refuses them with an error, never a corrupt volume).
func FuzzBuildFATRoundTrip(f *testing.F) {
	f.Add("meta-data", []byte("instance-id: x\n"), "user-data", []byte("#cloud-config\n"), "CIDATA")
	f.Add("a", []byte{}, "ünï-名前.txt", bytes.Repeat([]byte{0xFF}, 4097), "X")
	f.Add("same", []byte("1"), "same", []byte("2"), "LABEL")
	f.Fuzz(func(t *testing.T, n1 string, d1 []byte, n2 string, d2 []byte, label string) {
		files := map[string][]byte{n1: d1, n2: d2}
		img, err := BuildFAT(label, files)
		if err != nil {
			return
		}
		vol, err := cidatatest.ReadFAT(img)
		if err != nil {
			t.Fatalf("BuildFAT(%q) made a volume the reader rejects: %v", keys(files), err)
		}
		for n, d := range files {
			if !bytes.Equal(vol.Files[n], d) {
				t.Fatalf("%q: read %d bytes, wrote %d", n, len(vol.Files[n]), len(d))
			}
		}
		if len(vol.Files) != len(files) {
			t.Fatalf("read %q, wrote %q", keys(vol.Files), keys(files))
		}
	})
}
