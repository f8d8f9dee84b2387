package realch

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf16"
)

// fatVolume is what the test's own FAT reader finds: written from the FAT
// specification, sharing no code with BuildFAT.
type fatVolume struct {
	bpbLabel  string
	rootLabel string
	fsType    string
	files     map[string][]byte
	shortOf   map[string]string
}

func readFAT(img []byte) (*fatVolume, error) {
	if len(img) < 512 || img[510] != 0x55 || img[511] != 0xAA {
		return nil, fmt.Errorf("no boot signature")
	}
	u16 := func(o int) int { return int(binary.LittleEndian.Uint16(img[o:])) }
	bps, spc, rsvd, nfats, rootEnt := u16(11), int(img[13]), u16(14), int(img[16]), u16(17)
	tot := u16(19)
	if tot == 0 {
		tot = int(binary.LittleEndian.Uint32(img[32:]))
	}
	fatSz := u16(22)
	if bps != 512 || spc == 0 || nfats == 0 || fatSz == 0 || tot*bps > len(img) {
		return nil, fmt.Errorf("bad BPB: bps=%d spc=%d fats=%d fatsz=%d tot=%d len=%d", bps, spc, nfats, fatSz, tot, len(img))
	}
	rootSecs := (rootEnt*32 + bps - 1) / bps
	firstData := rsvd + nfats*fatSz + rootSecs
	clusters := (tot - firstData) / spc
	if clusters >= 4085 {
		return nil, fmt.Errorf("%d clusters: not FAT12", clusters)
	}
	fat := img[rsvd*bps : (rsvd+fatSz)*bps]
	// Every FAT copy must agree.
	for i := 1; i < nfats; i++ {
		if !bytes.Equal(fat, img[(rsvd+i*fatSz)*bps:(rsvd+(i+1)*fatSz)*bps]) {
			return nil, fmt.Errorf("FAT copy %d differs", i)
		}
	}
	next := func(c int) int {
		v := int(fat[c*3/2]) | int(fat[c*3/2+1])<<8
		if c&1 == 1 {
			return v >> 4
		}
		return v & 0xFFF
	}
	if next(0) != 0xF00|int(img[21]) || next(1) != 0xFFF {
		return nil, fmt.Errorf("reserved FAT entries %03x %03x", next(0), next(1))
	}
	vol := &fatVolume{
		bpbLabel: strings.TrimRight(string(img[43:54]), " "),
		fsType:   strings.TrimRight(string(img[54:62]), " "),
		files:    map[string][]byte{},
		shortOf:  map[string]string{},
	}
	root := img[(rsvd+nfats*fatSz)*bps : firstData*bps]
	var lfn []uint16
	var lfnSum byte
	seen := map[int]bool{}
	for i := 0; i < rootEnt; i++ {
		e := root[i*32 : i*32+32]
		if e[0] == 0 {
			break
		}
		if e[0] == 0xE5 {
			continue
		}
		attr := e[11]
		if attr == 0x0F {
			seq := int(e[0] & 0x1F)
			if e[0]&0x40 != 0 {
				lfn = make([]uint16, seq*13)
				lfnSum = e[13]
			}
			if lfn == nil || seq == 0 || seq*13 > len(lfn) || e[13] != lfnSum {
				return nil, fmt.Errorf("entry %d: orphan or inconsistent long-name entry", i)
			}
			var chars []uint16
			for _, o := range []int{1, 3, 5, 7, 9, 14, 16, 18, 20, 22, 24, 28, 30} {
				chars = append(chars, binary.LittleEndian.Uint16(e[o:]))
			}
			copy(lfn[(seq-1)*13:], chars)
			continue
		}
		if attr&0x08 != 0 {
			vol.rootLabel = strings.TrimRight(string(e[0:11]), " ")
			continue
		}
		short := string(e[0:11])
		var sum byte
		for _, b := range e[0:11] {
			sum = ((sum & 1) << 7) + (sum >> 1) + b
		}
		name := strings.TrimRight(short[:8], " ")
		if ext := strings.TrimRight(short[8:], " "); ext != "" {
			name += "." + ext
		}
		if lfn != nil {
			if sum != lfnSum {
				return nil, fmt.Errorf("%q: long name checksum %02x, alias sums to %02x", short, lfnSum, sum)
			}
			n := 0
			for n < len(lfn) && lfn[n] != 0 {
				n++
			}
			name = string(utf16.Decode(lfn[:n]))
		}
		lfn = nil
		size := int(binary.LittleEndian.Uint32(e[28:]))
		var data []byte
		for c := int(binary.LittleEndian.Uint16(e[26:])); size > 0 && c >= 2 && c < 0xFF8; c = next(c) {
			if seen[c] || c-2 >= clusters {
				return nil, fmt.Errorf("%s: cluster %d reused or out of range", name, c)
			}
			seen[c] = true
			off := (firstData + (c-2)*spc) * bps
			data = append(data, img[off:off+spc*bps]...)
		}
		if len(data) < size {
			return nil, fmt.Errorf("%s: chain holds %d bytes, size says %d", name, len(data), size)
		}
		vol.files[name] = data[:size]
		vol.shortOf[name] = short
	}
	return vol, nil
}

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
	vol, err := readFAT(img)
	if err != nil {
		t.Fatal(err)
	}
	if vol.bpbLabel != "CIDATA" || vol.rootLabel != "CIDATA" || vol.fsType != "FAT12" {
		t.Fatalf("labels %q/%q type %q", vol.bpbLabel, vol.rootLabel, vol.fsType)
	}
	if len(vol.files) != 3 {
		t.Fatalf("files %v: want meta-data, user-data, network-config", keys(vol.files))
	}
	md := string(vol.files["meta-data"])
	ud := string(vol.files["user-data"])
	nc := string(vol.files["network-config"])
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
	for n, s := range vol.shortOf {
		if aliases[s] || strings.ContainsAny(s, "abcdefghijklmnopqrstuvwxyz") {
			t.Errorf("%s: alias %q duplicate or lower case", n, s)
		}
		aliases[s] = true
	}
}

// libblkid (what cloud-init's NoCloud source uses to find the seed by label)
// must see a vfat volume labelled CIDATA.
func TestCIDataRecognisedByBlkid(t *testing.T) {
	blkid, err := exec.LookPath("blkid")
	if err != nil {
		t.Skip("blkid not installed")
	}
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
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	fs, _ := os.ReadFile("/proc/filesystems")
	if !strings.Contains(string(fs), "\tvfat\n") {
		t.Skip("this kernel has no vfat driver (/proc/filesystems); the FAT reader and blkid tests cover the format")
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
		t.Skipf("loop mount unavailable here: %v: %s", err, out)
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
	vol, err := readFAT(img)
	if err != nil {
		t.Fatal(err)
	}
	if vol.rootLabel != "TESTVOL" {
		t.Fatalf("label %q", vol.rootLabel)
	}
	for n, d := range files {
		if got, ok := vol.files[n]; !ok || !bytes.Equal(got, d) {
			t.Errorf("%s: got %d bytes (present %v), want %d", n, len(got), ok, len(d))
		}
	}
	if len(vol.files) != len(files) {
		t.Errorf("read %v", keys(vol.files))
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
		func(c *CloudInit) { c.SSHAuthorizedKeys = nil },
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
		vol, err := readFAT(img)
		if err != nil {
			t.Fatalf("BuildFAT(%q) made a volume the reader rejects: %v", keys(files), err)
		}
		for n, d := range files {
			if !bytes.Equal(vol.files[n], d) {
				t.Fatalf("%q: read %d bytes, wrote %d", n, len(vol.files[n]), len(d))
			}
		}
		if len(vol.files) != len(files) {
			t.Fatalf("read %q, wrote %q", keys(vol.files), keys(files))
		}
	})
}
