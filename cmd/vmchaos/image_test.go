package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/fakech/guestimg"
	"golang.org/x/crypto/ssh"
)

func runImageCmd(args ...string) (string, error) {
	c := newImageCmd()
	var out bytes.Buffer
	c.SetOut(&out)
	c.SetErr(&out)
	c.SetArgs(args)
	err := c.Execute()
	return out.String(), err
}

func TestImageFakeAuthorizesTheKey(t *testing.T) {
	dir := t.TempDir()
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	sp, _ := ssh.NewPublicKey(pub)
	keyFile := filepath.Join(dir, "key.pub")
	os.WriteFile(keyFile, ssh.MarshalAuthorizedKey(sp), 0o644)
	img := filepath.Join(dir, "guest.img")
	out, err := runImageCmd("fake", "--ssh-pubkey", keyFile, "--hostname", "web-0", "--ssh-port", "2200", "-o", img)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	g, err := guestimg.Load(img)
	if err != nil {
		t.Fatal(err)
	}
	k, _, _, _, err := ssh.ParseAuthorizedKey(g.Files[guestimg.AuthorizedKeysPath])
	if err != nil || !bytes.Equal(k.Marshal(), sp.Marshal()) {
		t.Fatalf("authorized_keys %q: %v", g.Files[guestimg.AuthorizedKeysPath], err)
	}
	hk, _ := g.HostPublicKey()
	if g.Hostname != "web-0" || g.SSHPort != 2200 || !strings.Contains(out, ssh.FingerprintSHA256(hk)) {
		t.Fatalf("image %s/%d, output %q", g.Hostname, g.SSHPort, out)
	}
	for _, bad := range [][]string{
		{"fake", "-o", img},
		{"fake", "--ssh-pubkey", keyFile},
		{"fake", "--ssh-pubkey", filepath.Join(dir, "missing"), "-o", img},
		{"fake", "--ssh-pubkey", img, "-o", filepath.Join(dir, "x.img")},
		{"fake", "--ssh-pubkey", keyFile, "--ssh-port", "0", "-o", img},
	} {
		if _, err := runImageCmd(bad...); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
