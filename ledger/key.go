package ledger

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vmchaos/vmchaos/durable"
	"golang.org/x/crypto/ssh"
)

// Key is the run's SSH identity: one ed25519 key per run, whose public half
// goes into every guest image the run builds (fake images through guestimg,
// real ones through the cloud-init seed).
type Key struct {
	signer  ssh.Signer
	private string
}

// keyComment marks the key in a guest's authorized_keys.
const keyComment = "vmchaos-ledger"

// NewKey returns the run's key from dir/id_ed25519, generating it (and
// dir/id_ed25519.pub) on first use. Reusing an existing key lets a restarted
// runner reach the guests of its run again.
func NewKey(dir string) (*Key, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ledger key: %w", err)
	}
	priv := filepath.Join(dir, "id_ed25519")
	b, err := os.ReadFile(priv)
	switch {
	case err == nil:
		s, err := ssh.ParsePrivateKey(b)
		if err != nil {
			return nil, fmt.Errorf("ledger key %s: %w", priv, err)
		}
		return &Key{signer: s, private: priv}, nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("ledger key: %w", err)
	}
	_, pk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ledger key: generate: %w", err)
	}
	blk, err := ssh.MarshalPrivateKey(pk, keyComment)
	if err != nil {
		return nil, fmt.Errorf("ledger key: encode: %w", err)
	}
	s, err := ssh.NewSignerFromKey(pk)
	if err != nil {
		return nil, fmt.Errorf("ledger key: %w", err)
	}
	k := &Key{signer: s, private: priv}
	// The public half first: a crash between the two writes leaves no
	// private key, so the next NewKey generates a consistent pair.
	if err := durable.WriteFile(priv+".pub", []byte(k.AuthorizedKey()+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("ledger key: %w", err)
	}
	if err := durable.WriteFile(priv, pem.EncodeToMemory(blk), 0o600); err != nil {
		return nil, fmt.Errorf("ledger key: %w", err)
	}
	return k, nil
}

// AuthorizedKey is the authorized_keys line for the key (no newline).
func (k *Key) AuthorizedKey() string {
	line := bytes.TrimSpace(ssh.MarshalAuthorizedKey(k.signer.PublicKey()))
	return string(line) + " " + keyComment
}

// PrivatePath is the private key file, usable as `ssh -i`.
func (k *Key) PrivatePath() string { return k.private }

// Signer is the key as an SSH signer.
func (k *Key) Signer() ssh.Signer { return k.signer }
