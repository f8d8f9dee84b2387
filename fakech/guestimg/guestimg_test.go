package guestimg

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

func TestBuildLoadRoundTrip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "g.img")
	img, err := Build(p, Options{AuthorizedKeys: []string{"ssh-ed25519 AAAA k1"}, Hostname: "h1", SSHPort: 2200})
	if err != nil {
		t.Fatal(err)
	}
	if !IsFakeImage(p) {
		t.Fatal("IsFakeImage false for a built image")
	}
	got, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if got.Hostname != "h1" || got.SSHPort != 2200 || string(got.Files[HostnamePath]) != "h1\n" ||
		!strings.Contains(string(got.Files[AuthorizedKeysPath]), "k1") {
		t.Fatalf("loaded %+v", got)
	}
	a, err := img.HostPublicKey()
	if err != nil {
		t.Fatal(err)
	}
	b, err := got.HostPublicKey()
	if err != nil || !bytes.Equal(a.Marshal(), b.Marshal()) {
		t.Fatalf("host key changed across save/load: %v", err)
	}
	// Every image gets its own host key; copies of one image share it.
	other, _ := New(Options{})
	c, _ := other.HostPublicKey()
	if bytes.Equal(a.Marshal(), c.Marshal()) {
		t.Fatal("two images share a host key")
	}
	if other.Hostname != "fake-guest" || other.SSHPort != DefaultSSHPort {
		t.Fatalf("defaults %+v", other)
	}
}

func TestDecodeRejects(t *testing.T) {
	if _, err := Decode([]byte("QFI\xfb qcow2 bytes")); !errors.Is(err, ErrNotFakeImage) {
		t.Fatalf("qcow2: %v", err)
	}
	if _, err := Decode([]byte(Magic + "{torn")); err == nil || errors.Is(err, ErrNotFakeImage) {
		t.Fatalf("torn image: %v", err)
	}
	if _, err := Decode([]byte(Magic + `{"ssh_port":70000}`)); err == nil {
		t.Fatal("port 70000 accepted")
	}
	img, err := Decode([]byte(Magic + `{"hostname":"x"}`))
	if err != nil || img.Files == nil || img.SSHPort != DefaultSSHPort {
		t.Fatalf("minimal image: %+v %v", img, err)
	}
	dir := t.TempDir()
	if IsFakeImage(filepath.Join(dir, "missing")) {
		t.Fatal("missing file is a fake image")
	}
	raw := filepath.Join(dir, "raw.img")
	os.WriteFile(raw, make([]byte, 4096), 0o644)
	if IsFakeImage(raw) {
		t.Fatal("zero-filled raw disk is a fake image")
	}
	if _, err := Load(raw); !errors.Is(err, ErrNotFakeImage) {
		t.Fatalf("Load raw: %v", err)
	}
}

// FuzzDecode: a disk image is outside input (a manager may hand fakech any
// file); decoding never panics, and a decoded image re-encodes.
func FuzzDecode(f *testing.F) {
	img, _ := New(Options{AuthorizedKeys: []string{"ssh-ed25519 AAAA x"}})
	img.Dirs = []string{"/var/lib/x"}
	b, _ := img.Encode()
	f.Add(b)
	f.Add([]byte(Magic + `{"files":{"/a":"aGk="},"ssh_port":-1}`))
	f.Add([]byte(Magic))
	f.Add([]byte("not an image"))
	f.Fuzz(func(t *testing.T, b []byte) {
		img, err := Decode(b)
		if err != nil {
			return
		}
		if img.SSHPort <= 0 || img.SSHPort > 65535 {
			t.Fatalf("decoded port %d", img.SSHPort)
		}
		if _, err := img.Encode(); err != nil {
			t.Fatal(err)
		}
		if k, ok := img.Files[HostKeyPath]; ok {
			_, _ = ssh.ParsePrivateKey(k)
		}
	})
}
