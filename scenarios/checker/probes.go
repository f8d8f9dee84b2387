package checker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// collectGoals reads, for every intent at its goal, the evidence the goal
// promises beyond the agent's word: a hibernated intent's snapshot in the
// registry, a ready intent's guest answering over SSH.
func (p *Poll) collectGoals(ctx context.Context, in *Input) {
	p.Pushed, p.Boot = map[string]error{}, map[string]BootProbe{}
	addr := map[string]string{}
	for _, v := range p.VMs {
		addr[v.Name] = v.Address
	}
	probe := in.BootID
	if probe == nil && in.Stack != nil && in.Stack.Ledger != nil {
		probe = in.Stack.GuestBootID
	}
	reg := in.Registry
	if reg == "" && in.Stack != nil {
		reg = in.Stack.Registry
	}
	for name, goal := range in.Goals {
		view, ok := p.Views[name]
		if !ok || view.Lifecycle != goal {
			continue
		}
		switch goal {
		case GoalHibernated:
			if in.Stack != nil && in.Stack.RegistryURL != "" {
				// the case runs a real registry: read it, not the dir
				_, err := ReadRegistrySnapshot(ctx, in.Stack.RegistryClient(0), in.Stack.RegistryURL, name, &in.digests)
				p.Pushed[name] = err
				continue
			}
			p.Pushed[name] = in.digests.verify(reg, name)
		case GoalReady:
			if probe == nil {
				p.Boot[name] = BootProbe{Err: errNoProbe}
				continue
			}
			if addr[name] == "" {
				p.Boot[name] = BootProbe{Err: fmt.Errorf("vm %s has no guest address", name)}
				continue
			}
			bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			id, err := probe(bctx, name, addr[name])
			cancel()
			p.Boot[name] = BootProbe{BootID: id, Err: err}
		}
	}
}

// manifest is the agent's registry entry <registry>/<name>.json: the data
// file is content-addressed and complete before the manifest names it.
type manifest struct {
	Name       string `json:"name"`
	File       string `json:"file"`
	SHA256     string `json:"sha256"`
	Size       int64  `json:"size"`
	SnapshotID string `json:"snapshot_id"`
}

// verify reads name's manifest and checks that its data file is there, whole
// and of the digest the manifest names: a wake could pull it.
func (c *digestCache) verify(reg, name string) error {
	if reg == "" {
		return fmt.Errorf("no registry dir")
	}
	b, err := os.ReadFile(filepath.Join(reg, name+".json"))
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("manifest %s: %w", name, err)
	}
	if m.Name != name || m.File == "" || filepath.Base(m.File) != m.File || m.SHA256 == "" {
		return fmt.Errorf("manifest %s: inconsistent (%+v)", name, m)
	}
	path := filepath.Join(reg, m.File)
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("data: %w", err)
	}
	if fi.Size() != m.Size {
		return fmt.Errorf("data %s: %d bytes, manifest says %d", m.File, fi.Size(), m.Size)
	}
	key := fmt.Sprintf("%d/%d/%s", fi.Size(), fi.ModTime().UnixNano(), m.SHA256)
	c.mu.Lock()
	done := c.ok[path] == key
	c.mu.Unlock()
	if done {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("data %s: read: %w", m.File, err)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != m.SHA256 {
		return fmt.Errorf("data %s: digest %s, manifest says %s", m.File, sum, m.SHA256)
	}
	c.mu.Lock()
	if c.ok == nil {
		c.ok = map[string]string{}
	}
	c.ok[path] = key
	c.mu.Unlock()
	return nil
}
