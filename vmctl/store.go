package vmctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/regress"
)

// indexVersion is written into both indexes; a newer one is refused rather
// than half-understood.
const indexVersion = 1

// vmIndex is the VM index document. Names maps every live record's name to
// its id; tombstones are deletes in progress that a converger rolls forward.
type vmIndex struct {
	Version    int                   `json:"version"`
	Generation int64                 `json:"generation"`
	VMs        map[string]*VM        `json:"vms"`
	Names      map[string]string     `json:"names"`
	Tombstones map[string]*Tombstone `json:"tombstones"`
	// TapSlots: tap mode's /30 slot per NIC, by VM name, kept for the life
	// of the store so a name always gets the same address and MAC.
	TapSlots map[string][]int `json:"tap_slots,omitempty"`
}

// snapIndex is the snapshot index document. Names holds pending records too:
// a pending record owns its name until it is finalized or removed.
type snapIndex struct {
	Version    int                   `json:"version"`
	Generation int64                 `json:"generation"`
	Snapshots  map[string]*Snapshot  `json:"snapshots"`
	Names      map[string]string     `json:"names"`
	Tombstones map[string]*Tombstone `json:"tombstones"`
}

// ErrCorruptIndex is returned for an index that cannot be decoded. The store
// never treats it as empty: an empty list would make every VM look gone.
var ErrCorruptIndex = errors.New("corrupt index")

func decodeVMIndex(path string, b []byte) (*vmIndex, error) {
	ix := &vmIndex{}
	if err := decodeIndex(path, b, ix); err != nil {
		return nil, err
	}
	if err := checkRecords("vm", path, ix.Version, ix.VMs, func(v *VM) string { return v.ID }); err != nil {
		return nil, err
	}
	ix.VMs = orEmpty(ix.VMs)
	ix.Names = orEmpty(ix.Names)
	ix.Tombstones = orEmpty(ix.Tombstones)
	return ix, nil
}

func decodeSnapIndex(path string, b []byte) (*snapIndex, error) {
	ix := &snapIndex{}
	if err := decodeIndex(path, b, ix); err != nil {
		return nil, err
	}
	if err := checkRecords("snapshot", path, ix.Version, ix.Snapshots, func(s *Snapshot) string { return s.ID }); err != nil {
		return nil, err
	}
	ix.Snapshots = orEmpty(ix.Snapshots)
	ix.Names = orEmpty(ix.Names)
	ix.Tombstones = orEmpty(ix.Tombstones)
	return ix, nil
}

// checkRecords holds the checks both indexes need after decoding, so the two
// cannot drift apart: the version, and every record present and stored under
// its own id. kind names the index in the errors ("vm", "snapshot").
func checkRecords[R any](kind, path string, version int, records map[string]*R, id func(*R) string) error {
	if version > indexVersion {
		return fmt.Errorf("%s index %s: version %d is newer than this vmctl (%d)", kind, path, version, indexVersion)
	}
	if version < 1 {
		// Every generation we write carries a version: "{}" or "null" is
		// not an empty store, it is a file someone else wrote.
		return fmt.Errorf("%s index %s: no version field: %w; the previous generation is kept at %s.prev", kind, path, ErrCorruptIndex, path)
	}
	for key, r := range records {
		if r == nil || id(r) != key {
			return fmt.Errorf("%s index %s: record %q malformed: %w; the previous generation is kept at %s.prev", kind, path, key, ErrCorruptIndex, path)
		}
	}
	return nil
}

// orEmpty gives a map an index left out (or wrote as null) its empty value,
// so callers can add to it without a nil check.
func orEmpty[K comparable, V any](m map[K]V) map[K]V {
	if m == nil {
		return map[K]V{}
	}
	return m
}

func decodeIndex(path string, b []byte, into any) error {
	if len(bytes.TrimSpace(b)) == 0 {
		return fmt.Errorf("index %s is empty (torn write?): %w; the previous generation is kept at %s.prev", path, ErrCorruptIndex, path)
	}
	if err := json.Unmarshal(b, into); err != nil {
		return fmt.Errorf("index %s cannot be decoded (%v): %w; the previous generation is kept at %s.prev", path, err, ErrCorruptIndex, path)
	}
	return nil
}

func readIndexFile(path string) ([]byte, bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read index: %w", err)
	}
	return b, true, nil
}

// loadVMs reads the VM index without a lock: commits replace it by rename, so
// a reader sees one whole generation or the other.
func (m *Manager) loadVMs() (*vmIndex, error) {
	b, ok, err := readIndexFile(m.vmIndexPath())
	if err != nil {
		return nil, err
	}
	if !ok {
		return &vmIndex{Version: indexVersion, VMs: map[string]*VM{}, Names: map[string]string{}, Tombstones: map[string]*Tombstone{}}, nil
	}
	return decodeVMIndex(m.vmIndexPath(), b)
}

func (m *Manager) loadSnaps() (*snapIndex, error) {
	b, ok, err := readIndexFile(m.snapIndexPath())
	if err != nil {
		return nil, err
	}
	if !ok {
		return &snapIndex{Version: indexVersion, Snapshots: map[string]*Snapshot{}, Names: map[string]string{}, Tombstones: map[string]*Tombstone{}}, nil
	}
	return decodeSnapIndex(m.snapIndexPath(), b)
}

// commitIndex writes one new generation: the current one is kept as .prev
// (a hard link, so it costs no copy), then the new one replaces it through
// durable.WriteFile (temp, fsync, rename, fsync dir).
func (m *Manager) commitIndex(ctx context.Context, path string, doc any, id string) error {
	b, err := json.Marshal(doc)
	if err != nil {
		return fmt.Errorf("commit %s: encode: %w", path, err)
	}
	prev := path + ".prev"
	if _, err := os.Stat(path); err == nil {
		_ = os.Remove(prev)
		if err := os.Link(path, prev); err != nil {
			return fmt.Errorf("commit %s: keep previous generation: %w", path, err)
		}
	}
	if regress.On("store-commit-in-place") {
		// the planted bug: the new generation written over the current
		// one in place, so a death before the write ends tears the index
		if err := os.WriteFile(path, b[:len(b)/2], 0o644); err != nil {
			return fmt.Errorf("commit %s: %w", path, err)
		}
	}
	if err := hit(ctx, "store.commit.before-rename", id); err != nil {
		return err
	}
	if err := durable.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("commit %s: %w", path, err)
	}
	return hit(ctx, "store.commit.after-rename", id)
}

// updateVMs runs fn on the current VM index under the index flock and commits
// the result. fn returning an error commits nothing. id names the VM in the
// store.commit.* failpoints.
func (m *Manager) updateVMs(ctx context.Context, id string, fn func(ix *vmIndex) error) error {
	return updateIndex(ctx, m, "vm", m.vmIndexLock(), m.vmIndexPath(), id, m.loadVMs, fn)
}

// updateSnaps is updateVMs for the snapshot index.
func (m *Manager) updateSnaps(ctx context.Context, id string, fn func(ix *snapIndex) error) error {
	return updateIndex(ctx, m, "snapshot", m.snapIndexLock(), m.snapIndexPath(), id, m.loadSnaps, fn)
}

// updateIndex is the locked read-modify-commit both indexes go through, so
// they lock, stamp and commit the same way. kind names the index in errors.
func updateIndex[I interface{ stamp() }](ctx context.Context, m *Manager, kind, lockPath, path, id string, load func() (I, error), fn func(I) error) error {
	l, err := lockFile(ctx, lockPath, exclusive, true)
	if err != nil {
		return fmt.Errorf("lock %s index: %w", kind, err)
	}
	defer l.Unlock()
	ix, err := load()
	if err != nil {
		return err
	}
	if err := fn(ix); err != nil {
		return err
	}
	ix.stamp()
	return m.commitIndex(ctx, path, ix, id)
}

// stamp marks an index about to be committed: this format, next generation.
func (ix *vmIndex) stamp() { ix.Version, ix.Generation = indexVersion, ix.Generation+1 }

// stamp marks an index about to be committed: this format, next generation.
func (ix *snapIndex) stamp() { ix.Version, ix.Generation = indexVersion, ix.Generation+1 }

// findTombstone returns a copy of the delete in progress for ref (an id or
// the deleted record's name), or nil when there is none or its id is not
// one we could have written (it names directories to remove).
func findTombstone(tombs map[string]*Tombstone, ref string) *Tombstone {
	for id, t := range tombs {
		if id == ref || t.Name == ref {
			if !validID(t.ID) {
				return nil
			}
			c := *t
			return &c
		}
	}
	return nil
}

// nextTombstone picks a tombstone of ref (an id or the deleted record's
// name) not in seen, marks it seen and returns a copy of it (nil, true when
// its id is not one we could have written); false once every tombstone of
// ref was seen. A finisher loops on it to finish every delete of a name.
func nextTombstone(tombs map[string]*Tombstone, ref string, seen map[string]bool) (*Tombstone, bool) {
	for id, t := range tombs {
		if !seen[id] && (id == ref || t.Name == ref) {
			seen[id] = true
			return findTombstone(map[string]*Tombstone{id: t}, id), true
		}
	}
	return nil, false
}

// finishEveryTombstone finishes, one by one, every tombstoned delete of ref
// (id or name) that tombs reads, re-reading the index after each, since a
// name can carry more than one such delete (each save or wake of the name
// after an interrupted rm gives it a new id). With none it returns notFound.
func finishEveryTombstone(ref string, notFound error, tombs func() (map[string]*Tombstone, error), finish func(*Tombstone) error) error {
	seen := map[string]bool{} // tombstones of ref already looked at
	finished := 0
	for {
		ts, err := tombs()
		if err != nil {
			return err
		}
		tomb, found := nextTombstone(ts, ref, seen)
		if !found {
			if finished == 0 {
				return notFound
			}
			return nil
		}
		if tomb == nil {
			continue
		}
		if err := finish(tomb); err != nil {
			return err
		}
		finished++
	}
}

// dropTombstone is the update that ends a delete; a finisher that lost the
// race to another one has nothing to commit.
func dropTombstone(tombs map[string]*Tombstone, id string) error {
	if _, ok := tombs[id]; !ok {
		return errNoChange
	}
	delete(tombs, id)
	return nil
}

// errNoChange lets an update function skip the commit.
var errNoChange = errors.New("no change")

func ignoreNoChange(err error) error {
	if errors.Is(err, errNoChange) {
		return nil
	}
	return err
}
