package fakech

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/cidata"
	"github.com/vmchaos/vmchaos/fakech/guestimg"
)

func TestSeedAddrsReadsRealchSeeds(t *testing.T) {
	p := filepath.Join(t.TempDir(), "cidata.img")
	if err := cidata.BuildCIData(p, cidata.CloudInit{Hostname: "h", SSHAuthorizedKeys: []string{"ssh-ed25519 AAAA k"},
		Interfaces: []cidata.GuestInterface{{MAC: "52:54:00:AA:00:01", Address: "127.1.2.3/30"}, {MAC: "52:54:00:aa:00:02", Address: "10.0.0.2/24"}}}); err != nil {
		t.Fatal(err)
	}
	got := seedAddrs(&chapi.VmConfig{Disks: []chapi.DiskConfig{{Path: "/nonexistent"}, {Path: p}}})
	if len(got) != 2 || got["52:54:00:aa:00:01"] != "127.1.2.3" || got["52:54:00:aa:00:02"] != "10.0.0.2" {
		t.Fatalf("seed addresses %v", got)
	}
}

// TestSeedAddrsReadsCocoonSeeds: cocoon writes network-config's addresses
// as a block list, then routes and a nameservers list (metadata/metadata.go
// networkConfigTmpl; this text is what cocoon 34c6c4a wrote for a CNI NIC).
// The interface's address must be found, the DNS servers never taken for it.
func TestSeedAddrsReadsCocoonSeeds(t *testing.T) {
	nc := `version: 2
ethernets:
  id0:
    match:
      macaddress: "62:E5:E3:DA:B3:89"
    addresses:
      - 127.77.0.2/24
    routes:
      - to: default
        via: 127.77.0.1
    nameservers:
      addresses:
        - 8.8.8.8
        - 1.1.1.1
  id1:
    match:
      macaddress: "62:e5:e3:da:b3:8a"
    nameservers:
      addresses:
        - 9.9.9.9
  id2:
    match:
      macaddress: "62:e5:e3:da:b3:8b"
    dhcp4: true
`
	img, err := cidata.BuildFAT("CIDATA", map[string][]byte{"meta-data": []byte("instance-id: X\nlocal-hostname: v1\n"),
		"network-config": []byte(nc)})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "cidata.img")
	if err := os.WriteFile(p, img, 0o644); err != nil {
		t.Fatal(err)
	}
	got := seedAddrs(&chapi.VmConfig{Disks: []chapi.DiskConfig{{Path: "/nonexistent"}, {Path: p}}})
	if len(got) != 1 || got["62:e5:e3:da:b3:89"] != "127.77.0.2" {
		t.Fatalf("seed addresses %v, want only 62:e5:e3:da:b3:89 → 127.77.0.2", got)
	}
}

// FuzzSeedFAT: arbitrary bytes as a seed volume never panic.
func FuzzSeedFAT(f *testing.F) {
	p := filepath.Join(f.TempDir(), "cidata.img")
	if err := cidata.BuildCIData(p, cidata.CloudInit{Hostname: "h", SSHAuthorizedKeys: []string{"ssh-ed25519 AAAA k"},
		Interfaces: []cidata.GuestInterface{{MAC: "52:54:00:aa:00:01", Address: "127.1.2.3/30"}}}); err != nil {
		f.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	f.Add(b)
	f.Fuzz(func(t *testing.T, img []byte) {
		if nc, ok := fatFile(img, "network-config"); ok {
			_ = parseNetworkConfig(nc)
		}
	})
}

// TestCloudInitTakesKeysFromTheSeed: the guest reads the seed vmctl writes
// the way cloud-init does. On the first boot of an instance the seed's host
// key replaces the image's and its authorized key is added; a later boot of
// the same instance leaves the disk alone, a new instance applies its seed.
func TestCloudInitTakesKeysFromTheSeed(t *testing.T) {
	hostKey := func() ([]byte, ssh.PublicKey) {
		_, priv, _ := ed25519.GenerateKey(rand.Reader)
		blk, err := ssh.MarshalPrivateKey(priv, "")
		if err != nil {
			t.Fatal(err)
		}
		s, _ := ssh.NewSignerFromKey(priv)
		return pem.EncodeToMemory(blk), s.PublicKey()
	}
	seedOf := func(host string, key []byte, authorized string) seed {
		p := filepath.Join(t.TempDir(), "cidata.img")
		if err := cidata.BuildCIData(p, cidata.CloudInit{Hostname: host, SSHHostKey: key, SSHAuthorizedKeys: []string{authorized}}); err != nil {
			t.Fatal(err)
		}
		return readSeed(&chapi.VmConfig{Disks: []chapi.DiskConfig{{Path: "/boot-disk-is-never-the-seed"}, {Path: p}}})
	}
	k1, pub1 := hostKey()
	sd := seedOf("a", k1, "ssh-ed25519 AAAAkey1 run")
	if !sd.found || sd.instanceID != "vmchaos-a" || sd.hostname != "a" || string(sd.hostKey) != string(k1) || len(sd.authorizedKeys) != 1 || sd.authorizedKeys[0] != "ssh-ed25519 AAAAkey1 run" {
		t.Fatalf("seed read back as %+v", sd)
	}
	img, err := guestimg.New(guestimg.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := newGuest("/disk", img, 0)
	g.cloudInit(sd)
	b, _ := g.hostKey()
	if s, err := ssh.ParsePrivateKey(b); err != nil || string(s.PublicKey().Marshal()) != string(pub1.Marshal()) {
		t.Fatalf("host key after the seed: %v", err)
	}
	if got := string(g.authorizedKeys()); got != "\nssh-ed25519 AAAAkey1 run\n" && got != "ssh-ed25519 AAAAkey1 run\n" {
		t.Fatalf("authorized_keys %q", got)
	}
	k2, _ := hostKey()
	g.cloudInit(seedOf("a", k2, "ssh-ed25519 AAAAkey2 run")) // same instance: applied once only
	if b, _ := g.hostKey(); string(b) != string(k1) || strings.Contains(string(g.authorizedKeys()), "key2") {
		t.Fatal("a second boot of the same instance applied its seed again")
	}
	g.cloudInit(seedOf("b", k2, "ssh-ed25519 AAAAkey2 run")) // a new instance
	if b, _ := g.hostKey(); string(b) != string(k2) || !strings.Contains(string(g.authorizedKeys()), "key1") || !strings.Contains(string(g.authorizedKeys()), "key2") {
		t.Fatalf("new instance: host key replaced %v, authorized_keys %q", string(b) == string(k2), g.authorizedKeys())
	}
}
