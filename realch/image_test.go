package realch

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/vmchaos/vmchaos/cidata"
)

// The guest agent reads exactly what cidata.BuildCIData writes: the plan it prints
// for a seed is what the guest then applies (hostname, root's keys, a static
// address by MAC with its gateway, or DHCP on every NIC).
func TestSeedAgentPlansWhatTheSeedSays(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	key1 := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJx run@host"
	key2 := `command="echo \"hi\"" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJy other`
	cases := []struct {
		name string
		ci   cidata.CloudInit
		want []string
	}{
		{"static", cidata.CloudInit{Hostname: "vm-0", SSHAuthorizedKeys: []string{key1, key2}, Interfaces: []cidata.GuestInterface{
			{MAC: "52:54:00:1E:00:02", Address: "172.30.0.2/30", Gateway: "172.30.0.1", Nameservers: []string{"172.30.0.1"}},
			{MAC: "52:54:00:1e:00:06", Address: "172.30.0.6/30"},
		}}, []string{
			"hostname vm-0", "key " + key1, "key " + key2,
			"static 52:54:00:1e:00:02 172.30.0.2/30 172.30.0.1", "static 52:54:00:1e:00:06 172.30.0.6/30",
		}},
		{"dhcp", cidata.CloudInit{Hostname: "base-src", SSHAuthorizedKeys: []string{key1}}, []string{
			"hostname base-src", "key " + key1, "dhcp",
		}},
	}
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	blk, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	hostKey := pem.EncodeToMemory(blk)
	cases = append(cases, struct {
		name string
		ci   cidata.CloudInit
		want []string
	}{"hostkey", cidata.CloudInit{Hostname: "h", SSHAuthorizedKeys: []string{key1}, SSHHostKey: hostKey}, []string{
		"hostname h", "key " + key1, "hostkey " + strings.ReplaceAll(string(hostKey), "\n", `\n`), "dhcp",
	}})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			files, err := c.ci.Files()
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			for n, b := range files {
				if err := os.WriteFile(filepath.Join(dir, n), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			out, err := exec.Command(sh, "guest/vmchaos-seed", "plan", dir).CombinedOutput()
			if err != nil {
				t.Fatalf("plan: %v\n%s", err, out)
			}
			got := strings.Split(strings.TrimSpace(string(out)), "\n")
			if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
				t.Fatalf("plan:\n%s\nwant:\n%s\nseed:\n%s%s", strings.Join(got, "\n"), strings.Join(c.want, "\n"), files["user-data"], files["network-config"])
			}
			// boot writes the host key with printf %b: the PEM comes back whole.
			for _, l := range got {
				if v, ok := strings.CutPrefix(l, "hostkey "); ok {
					pemOut, err := exec.Command(sh, "-c", `printf '%b' "$1"`, "sh", v).Output()
					if err != nil || !bytes.Equal(pemOut, c.ci.SSHHostKey) {
						t.Fatalf("host key through printf %%b: %v\n%s", err, pemOut)
					}
				}
			}
		})
	}
}

func TestParseInReleaseFindsThePackageIndex(t *testing.T) {
	in := "Origin: Debian\nSuite: stable\nMD5Sum:\n 0123456789abcdef0123456789abcdef 8788 main/binary-amd64/Packages.xz\n" +
		"SHA256:\n " + strings.Repeat("a", 64) + " 123 contrib/binary-amd64/Packages.xz\n " + strings.Repeat("b", 64) + " 8788 main/binary-amd64/Packages.xz\n" +
		"-----BEGIN PGP SIGNATURE-----\n"
	got, err := parseInRelease([]byte(in))
	if err != nil || got != strings.Repeat("b", 64) {
		t.Fatalf("got %q %v", got, err)
	}
	if _, err := parseInRelease([]byte("SHA256:\n " + strings.Repeat("a", 64) + " 1 main/binary-arm64/Packages.xz\n")); err == nil {
		t.Fatal("no amd64 index: want an error")
	}
}

// The cache key moves with everything the image is made of.
func TestImageKeyFollowsItsInputs(t *testing.T) {
	dir := t.TempDir()
	writer, writer2 := filepath.Join(dir, "w1"), filepath.Join(dir, "w2")
	for p, b := range map[string]string{writer: "writer v1", writer2: "writer v2"} {
		if err := os.WriteFile(p, []byte(b), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	base := ImageOptions{Suite: "bookworm", Mirror: DefaultMirror, SizeMiB: 2048, Writer: writer}
	if err := base.findWriter(); err != nil {
		t.Fatal(err)
	}
	k0, err := imageKey(base, "idx1")
	if err != nil {
		t.Fatal(err)
	}
	if k1, _ := imageKey(base, "idx1"); k1 != k0 {
		t.Fatalf("same inputs, keys %s %s", k0, k1)
	}
	other := base
	other.SizeMiB = 4096
	otherWriter := base
	otherWriter.Writer = writer2
	if err := otherWriter.findWriter(); err != nil {
		t.Fatal(err)
	}
	for name, k := range map[string]func() (string, error){
		"index":  func() (string, error) { return imageKey(base, "idx2") },
		"size":   func() (string, error) { return imageKey(other, "idx1") },
		"writer": func() (string, error) { return imageKey(otherWriter, "idx1") },
	} {
		if k2, _ := k(); k2 == k0 {
			t.Errorf("%s changed, key did not", name)
		}
	}
}

func TestMBRHasOneLinuxPartitionAtOneMiB(t *testing.T) {
	b := mbr(2 << 30)
	p := b[446:462]
	if b[510] != 0x55 || b[511] != 0xaa || p[4] != 0x83 {
		t.Fatalf("not an MBR with a Linux partition: % x", b[446:])
	}
	if start, n := binary.LittleEndian.Uint32(p[8:]), binary.LittleEndian.Uint32(p[12:]); start != 2048 || n != (2<<30-1<<20)/512 {
		t.Fatalf("partition start %d sectors %d", start, n)
	}
}

// A bzImage built here (setup header, gzip payload holding an ELF) gives the
// ELF back; a payload that is not a kernel is refused.
func TestExtractVmlinuxFromABzImage(t *testing.T) {
	elf := append([]byte("\x7fELF"), bytes.Repeat([]byte("kernel"), 1000)...)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(elf)
	zw.Close()
	mk := func(payload []byte) string {
		b := make([]byte, 5*512) // 4 setup sectors + the boot sector
		b[0x1f1] = 4
		copy(b[0x202:], "HdrS")
		binary.LittleEndian.PutUint16(b[0x206:], 0x20f)
		binary.LittleEndian.PutUint32(b[0x248:], 0x40) // after some decompressor code
		binary.LittleEndian.PutUint32(b[0x24c:], uint32(len(payload)))
		b = append(b, make([]byte, 0x40)...)
		b = append(b, payload...)
		b = append(b, 0, 0, 0, 0) // the size trailer the real ones carry
		p := filepath.Join(t.TempDir(), "vmlinuz")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	dst := filepath.Join(t.TempDir(), "vmlinux")
	if err := ExtractVmlinux(context.Background(), mk(gz.Bytes()), dst); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, elf) {
		t.Fatalf("extracted %d bytes, want the %d-byte ELF", len(got), len(elf))
	}
	var notELF bytes.Buffer
	zw = gzip.NewWriter(&notELF)
	zw.Write([]byte("MZ not a kernel"))
	zw.Close()
	if err := ExtractVmlinux(context.Background(), mk(notELF.Bytes()), dst); err == nil || !strings.Contains(err.Error(), "ELF") {
		t.Fatalf("non-ELF payload: %v", err)
	}
	if _, _, err := bzImagePayload(make([]byte, 4096)); err == nil {
		t.Fatal("no setup header: want an error")
	}
}

func TestDiskImageTypeFromMagic(t *testing.T) {
	dir := t.TempDir()
	q := filepath.Join(dir, "q")
	r := filepath.Join(dir, "r")
	os.WriteFile(q, []byte("QFI\xfb\x00\x00\x00\x03rest"), 0o644)
	os.WriteFile(r, make([]byte, 512), 0o644)
	if got := diskImageType(q); got != "qcow2" {
		t.Errorf("qcow2 magic: %s", got)
	}
	if got := diskImageType(r); got != "raw" {
		t.Errorf("zeros: %s", got)
	}
	if got := diskImageType(filepath.Join(dir, "none")); got != "raw" {
		t.Errorf("missing: %s", got)
	}
}

// Downloaded and packaged bytes: the parsers never panic, and what they
// return lies inside their input.
func FuzzBzImagePayload(f *testing.F) {
	b := make([]byte, 0x300)
	b[0x1f1] = 0
	copy(b[0x202:], "HdrS")
	binary.LittleEndian.PutUint16(b[0x206:], 0x20f)
	binary.LittleEndian.PutUint32(b[0x248:], 0)
	binary.LittleEndian.PutUint32(b[0x24c:], 4)
	f.Add(b)
	f.Add([]byte("HdrS"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, i, err := bzImagePayload(b)
		if err != nil {
			return
		}
		if i < 0 || i >= len(kernelCompressions) || len(p) == 0 || !bytes.Contains(b, p) || !bytes.HasPrefix(p, kernelCompressions[i].magic) {
			t.Fatalf("payload %d bytes, format %d: not a slice of the input with its magic", len(p), i)
		}
	})
}

func FuzzParseInRelease(f *testing.F) {
	f.Add([]byte("SHA256:\n " + strings.Repeat("b", 64) + " 8788 main/binary-amd64/Packages.xz\n"))
	f.Add([]byte("MD5Sum:\n x 1 main/binary-amd64/Packages.xz\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := parseInRelease(b)
		if err == nil && (len(got) != 64 || !bytes.Contains(b, []byte(got))) {
			t.Fatalf("digest %q not a 64-character field of the input", got)
		}
	})
}
