package ledger

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
)

func hostKey(t *testing.T) ssh.PublicKey {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestPinFirstContactThenEnforce(t *testing.T) {
	p := pinFile{path: filepath.Join(t.TempDir(), "known_hosts")}
	k1, k2 := hostKey(t), hostKey(t)
	if err := p.check("g1", "127.1.2.3:2222", k1); err != nil {
		t.Fatal(err)
	}
	if err := p.check("g1", "127.9.9.9:2222", k1); err != nil {
		t.Fatalf("same key from a new address (a woken guest): %v", err)
	}
	err := p.check("g1", "127.1.2.3:2222", k2)
	if !errors.Is(err, ErrHostKeyChanged) || !strings.Contains(err.Error(), ssh.FingerprintSHA256(k1)) ||
		!strings.Contains(err.Error(), ssh.FingerprintSHA256(k2)) {
		t.Fatalf("changed key: %v", err)
	}
	if err := p.check("g2", "127.1.2.3:2222", k2); err != nil {
		t.Fatalf("another guest pins its own key: %v", err)
	}
	if err := p.drop("g1"); err != nil {
		t.Fatal(err)
	}
	if err := p.check("g1", "127.1.2.3:2222", k2); err != nil {
		t.Fatalf("after drop the next contact pins again: %v", err)
	}
	if err := p.check("g2", "127.1.2.3:2222", k1); !errors.Is(err, ErrHostKeyChanged) {
		t.Fatalf("drop of g1 must keep g2's pin: %v", err)
	}
}

// TestPinConcurrentFirstContact: racing first contacts pin exactly one key.
func TestPinConcurrentFirstContact(t *testing.T) {
	p := pinFile{path: filepath.Join(t.TempDir(), "known_hosts")}
	keys := make([]ssh.PublicKey, 8)
	for i := range keys {
		keys[i] = hostKey(t)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(keys))
	for i := range keys {
		wg.Go(func() { errs[i] = p.check("g", "127.0.0.2:2222", keys[i]) })
	}
	wg.Wait()
	accepted := 0
	for _, err := range errs {
		if err == nil {
			accepted++
		} else if !errors.Is(err, ErrHostKeyChanged) {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(p.path)
	if accepted != 1 || strings.Count(string(b), "\n") != 1 {
		t.Fatalf("%d keys accepted, pins file:\n%s", accepted, b)
	}
}
