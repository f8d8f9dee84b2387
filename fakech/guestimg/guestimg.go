// Package guestimg is the fake guest's disk image format: a small
// self-describing file (magic line + JSON) that holds the guest's files,
// including its SSH host key and authorized keys, so that clones keep them the
// way clones of real images do. The manager treats the file as opaque bytes;
// fakech reads it at boot and writes it back when the guest syncs.
package guestimg

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/vmchaos/vmchaos/durable"
	"golang.org/x/crypto/ssh"
)

// Magic is the first line of every fake guest image.
const Magic = "VMCHAOS-FAKE-GUEST-IMAGE v1\n"

// DefaultSSHPort is where the fake guest's sshd listens on each NIC address:
// where a real guest's does, so a manager treats both alike. Binding it
// needs root (or CAP_NET_BIND_SERVICE), and a host sshd listening on the
// wildcard address takes the port from every loopback address.
const DefaultSSHPort = 22

// Well-known paths inside the image.
const (
	HostKeyPath        = "/etc/ssh/ssh_host_ed25519_key"
	AuthorizedKeysPath = "/root/.ssh/authorized_keys"
	HostnamePath       = "/etc/hostname"
)

// Image is the decoded content of a fake guest disk.
type Image struct {
	Hostname string            `json:"hostname"`
	SSHPort  int               `json:"ssh_port"`
	Files    map[string][]byte `json:"files"` // absolute guest path → content
	// Dirs are directories created in the guest (mkdir) that may hold no
	// file; a file's parent directories exist implicitly.
	Dirs []string `json:"dirs,omitempty"`
}

// Options configures Build.
type Options struct {
	AuthorizedKeys []string // authorized_keys lines
	Hostname       string   // default "fake-guest"
	SSHPort        int      // default DefaultSSHPort
}

// ErrNotFakeImage means the file does not start with Magic.
var ErrNotFakeImage = errors.New("not a fake guest image")

// New returns an image with a freshly generated host key.
func New(o Options) (*Image, error) {
	if o.Hostname == "" {
		o.Hostname = "fake-guest"
	}
	if o.SSHPort == 0 {
		o.SSHPort = DefaultSSHPort
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("guest image: host key: %w", err)
	}
	blk, err := ssh.MarshalPrivateKey(priv, "fake-guest host key")
	if err != nil {
		return nil, fmt.Errorf("guest image: host key: %w", err)
	}
	img := &Image{Hostname: o.Hostname, SSHPort: o.SSHPort, Files: map[string][]byte{
		HostKeyPath:        pem.EncodeToMemory(blk),
		AuthorizedKeysPath: []byte(strings.Join(o.AuthorizedKeys, "\n") + "\n"),
		HostnamePath:       []byte(o.Hostname + "\n"),
	}}
	return img, nil
}

// Build writes a new image to path.
func Build(path string, o Options) (*Image, error) {
	img, err := New(o)
	if err != nil {
		return nil, err
	}
	return img, img.Save(path)
}

// Encode serialises the image.
func (img *Image) Encode() ([]byte, error) {
	b, err := json.Marshal(img)
	if err != nil {
		return nil, err
	}
	return append([]byte(Magic), b...), nil
}

// Save writes the image durably (what a guest `sync` does).
func (img *Image) Save(path string) error {
	b, err := img.Encode()
	if err != nil {
		return fmt.Errorf("guest image %s: %w", path, err)
	}
	return durable.WriteFile(path, b, 0o644)
}

// Decode parses image bytes.
func Decode(b []byte) (*Image, error) {
	img, _, err := DecodeFrom(bytes.NewReader(b))
	return img, err
}

// DecodeFrom parses an image from the start of r and returns it with the
// number of bytes it took. Bytes after the image are never read: a disk may
// be larger than its image (a manager grows disks), and the guest rewrites
// the image in place, so a kill mid-write can leave old bytes behind it.
func DecodeFrom(r io.Reader) (*Image, int64, error) {
	br := bufio.NewReader(r)
	head := make([]byte, len(Magic))
	if _, err := io.ReadFull(br, head); err != nil || string(head) != Magic {
		return nil, 0, ErrNotFakeImage
	}
	var img Image
	dec := json.NewDecoder(br)
	if err := dec.Decode(&img); err != nil {
		return nil, 0, fmt.Errorf("fake guest image: corrupt: %w", err)
	}
	if img.Files == nil {
		img.Files = map[string][]byte{}
	}
	if img.SSHPort == 0 {
		img.SSHPort = DefaultSSHPort
	}
	if img.SSHPort < 0 || img.SSHPort > 65535 {
		return nil, 0, fmt.Errorf("fake guest image: corrupt: ssh_port %d", img.SSHPort)
	}
	return &img, int64(len(Magic)) + dec.InputOffset(), nil
}

// Load reads an image from path.
func Load(path string) (*Image, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("guest image: %w", err)
	}
	img, err := Decode(b)
	if err != nil {
		return nil, fmt.Errorf("guest image %s: %w", path, err)
	}
	return img, nil
}

// IsFakeImage reports whether path starts with Magic.
func IsFakeImage(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	line, _ := bufio.NewReader(f).ReadString('\n')
	return line == Magic
}

// HostSigner returns the guest's SSH host key.
func (img *Image) HostSigner() (ssh.Signer, error) {
	s, err := ssh.ParsePrivateKey(img.Files[HostKeyPath])
	if err != nil {
		return nil, fmt.Errorf("guest image: host key: %w", err)
	}
	return s, nil
}

// HostPublicKey returns the guest's SSH host public key, which a manager uses
// to pin the guest's identity.
func (img *Image) HostPublicKey() (ssh.PublicKey, error) {
	s, err := img.HostSigner()
	if err != nil {
		return nil, err
	}
	return s.PublicKey(), nil
}
