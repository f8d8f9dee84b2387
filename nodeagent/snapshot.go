package nodeagent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/regress"
	"github.com/vmchaos/vmchaos/timescale"
	vmctl "github.com/vmchaos/vmchaos/vmctl/api" // the agent reads vmctl only through its output
)

// saveSnapshot saves the VM's hibernate snapshot under the VM's name. When
// the name is held, it removes the holder by the ID its adapter typed from either
// rejection ("already exists (held by ID)" for a finalized holder, "already in
// use by ID" for a pending one left by a SIGKILLed save) and saves once more;
// a lease-held refusal of that rm means the dead save's child is still
// finishing, so it is retried for --lease-wait (seed 001 #3).
func (a *Agent) saveSnapshot(ctx context.Context, name, vmID string) (string, error) {
	onlyExists := regress.On("save-match-already-exists-only")
	for attempt := 0; ; attempt++ {
		_, err := a.call(ctx, name, manager.Call{Verb: manager.VerbSnapshotSave, VM: vmID, Name: name})
		if err == nil {
			a.metrics.inc(mSave, "ok")
			s, err := a.snapshotByName(ctx, name)
			if err != nil {
				return "", err
			}
			if s == nil || s.State != manager.SnapReady {
				return "", fmt.Errorf("snapshot save %s: no ready snapshot named %s after save", vmID, name)
			}
			return s.ID, nil
		}
		a.metrics.inc(mSave, "failed")
		a.collectAfterKilledSave(ctx, name, err)
		h, held := nameHolder(err, manager.ObjectSnapshot)
		if onlyExists && held && h.Pending {
			held = false // the historical bug: a pending holder's rejection is not recognised
		}
		holder := ""
		if held {
			holder = h.Holder
		}
		if held && holder == "" && attempt < 1 && ctx.Err() == nil {
			// A manager that does not name a finished holder (cocoon's
			// `snapshot name %q already exists`): the refusal leaves the
			// lookup to the embedder, so the holder is found by its name
			// among the finished records and removed by its id like any
			// other (found nowhere: nothing to remove, the refusal stands).
			id, lerr := a.readySnapshotID(ctx, name)
			if lerr != nil {
				return "", fmt.Errorf("snapshot name %q held; looking its holder up: %w", name, lerr)
			}
			holder, held = id, id != ""
		}
		if !held || attempt >= 1 || ctx.Err() != nil {
			return "", err
		}
		target := holder
		if regress.On("save-rm-by-name") {
			// The historical recovery resolved the name through a lookup
			// that skips pending records, so a half-committed holder is
			// never found.
			t, lerr := a.readySnapshotID(ctx, name)
			if lerr != nil {
				return "", lerr
			}
			if t == "" {
				return "", fmt.Errorf("snapshot name %q held by %s and rm by name failed: %s", name, holder, vmctl.MsgSnapshotNotFound)
			}
			target = t
		}
		a.log.Warn("snapshot name held; removing the holder by id and saving again", "vm", name, "holder", holder)
		if err := a.removeSnapshot(ctx, name, target, !regress.On("save-no-lease-wait")); err != nil {
			return "", fmt.Errorf("snapshot name %q held by %s and rm failed: %w", name, holder, err)
		}
	}
}

// readySnapshotID resolves a name among finalized records only.
func (a *Agent) readySnapshotID(ctx context.Context, name string) (string, error) {
	snaps, err := a.listSnapshots(ctx, name)
	if err != nil {
		return "", err
	}
	for _, s := range snaps {
		if s.Name == name && s.State == manager.SnapReady {
			return s.ID, nil
		}
	}
	return "", nil
}

// removeSnapshot removes a snapshot by id (or name). With leaseWait a
// lease-held refusal is retried until --lease-wait: the flock is owned by a
// live process, so "held" means "that process is still running", a transient
// that clears by itself. Every other refusal is returned at once.
func (a *Agent) removeSnapshot(ctx context.Context, name, ref string, leaseWait bool) error {
	deadline := time.Now().Add(a.cfg.LeaseWait)
	for {
		_, err := a.call(ctx, name, manager.Call{Verb: manager.VerbSnapshotRm, Snapshot: ref})
		if err == nil || isNotFound(err) {
			return nil
		}
		if !leaseWait || !isLeaseHeld(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		a.log.Info("snapshot lease held by a live process; waiting to remove it", "vm", name, "snapshot", ref)
		if err := timescale.SleepRaw(ctx, a.cfg.ReadyTick); err != nil {
			return err
		}
	}
}

// registryManifest describes one pushed hibernate snapshot. The data file is
// content-addressed and renamed into place before the manifest is written, so
// a manifest always names a complete file.
type registryManifest struct {
	Name       string    `json:"name"`
	File       string    `json:"file"`
	SHA256     string    `json:"sha256"`
	Size       int64     `json:"size"`
	SnapshotID string    `json:"snapshot_id"`
	Image      string    `json:"image,omitempty"` // the intent's source snapshot when it was taken
	PushedAt   time.Time `json:"pushed_at"`

	oci     *ocispec.Manifest // --registry: the artifact's manifest
	ociDesc ocispec.Descriptor
}

func (a *Agent) manifestPath(name string) string {
	return filepath.Join(a.cfg.RegistryDir, name+".json")
}

// readManifest reads name's registry entry: a missing one is
// os.ErrNotExist, every other failure an error.
func (a *Agent) readManifest(ctx context.Context, name string) (*registryManifest, error) {
	if a.cfg.RegistryURL != "" {
		return a.ociReadManifest(ctx, name)
	}
	b, err := os.ReadFile(a.manifestPath(name))
	if err != nil {
		return nil, err
	}
	var m registryManifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("registry manifest %s: %w", name, err)
	}
	if m.Name != name || m.File == "" || filepath.Base(m.File) != m.File {
		return nil, fmt.Errorf("registry manifest %s: inconsistent", name)
	}
	return &m, nil
}

func fileDigest(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// push exports the snapshot and pushes it: into the registry dir
// atomically, or (--registry) as an OCI artifact committed by its tag put.
// image is the intent's source snapshot, recorded for the identity guard.
func (a *Agent) push(ctx context.Context, name, snapID, image string) error {
	if snapID == "" {
		return fmt.Errorf("push %s: no snapshot id recorded", name)
	}
	a.dropStaging(name)
	tmp := filepath.Join(a.cfg.RegistryDir, fmt.Sprintf(".%s.push-%d", name, time.Now().UnixNano()))
	defer os.Remove(tmp)
	if _, err := a.call(ctx, name, manager.Call{Verb: manager.VerbExport, Snapshot: snapID, File: tmp}); err != nil {
		return err
	}
	if a.cfg.RegistryURL != "" {
		return a.ociPush(ctx, name, snapID, image, tmp)
	}
	f, err := os.Open(tmp)
	if err != nil {
		return fmt.Errorf("push %s: %w", name, err)
	}
	err = f.Sync()
	f.Close()
	if err != nil {
		return fmt.Errorf("push %s: fsync: %w", name, err)
	}
	sum, size, err := fileDigest(tmp)
	if err != nil {
		return fmt.Errorf("push %s: %w", name, err)
	}
	file := name + "." + sum[:16] + ".snap"
	if err := os.Rename(tmp, filepath.Join(a.cfg.RegistryDir, file)); err != nil {
		return fmt.Errorf("push %s: %w", name, err)
	}
	if err := durable.SyncDir(a.cfg.RegistryDir); err != nil {
		return err
	}
	m := registryManifest{Name: name, File: file, SHA256: sum, Size: size, SnapshotID: snapID, Image: image, PushedAt: time.Now().UTC()}
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := durable.WriteFile(a.manifestPath(name), b, 0o644); err != nil {
		return err
	}
	return a.pruneRegistry(name, file)
}

// pruneRegistry removes data files of name other than keep ("" = all).
func (a *Agent) pruneRegistry(name, keep string) error {
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(name) + `\.[0-9a-f]{16}\.snap$`)
	ents, err := os.ReadDir(a.cfg.RegistryDir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Name() != keep && re.MatchString(e.Name()) {
			if err := os.Remove(filepath.Join(a.cfg.RegistryDir, e.Name())); err != nil && !os.IsNotExist(err) {
				return err
			}
		}
	}
	return durable.SyncDir(a.cfg.RegistryDir)
}

// dropRegistry removes name's registry entry: manifest first, so no reader
// ever sees a manifest without its data.
func (a *Agent) dropRegistry(ctx context.Context, name string) error {
	if a.cfg.RegistryURL != "" {
		return a.ociDrop(ctx, name)
	}
	if err := os.Remove(a.manifestPath(name)); err != nil && !os.IsNotExist(err) {
		return err
	}
	return a.pruneRegistry(name, "")
}

// ensureLocalSnapshot makes a verified hibernate snapshot named name
// available locally, pulling it from the registry when the local one is
// missing or not the one that was pushed. It returns the local id.
func (a *Agent) ensureLocalSnapshot(ctx context.Context, rec *record) (string, error) {
	name := rec.Name
	m, merr := a.readManifest(ctx, name)
	if merr != nil && !errors.Is(merr, os.ErrNotExist) {
		return "", merr
	}
	if err := imageGuard(rec, m); err != nil {
		return "", err
	}
	local, err := a.snapshotByName(ctx, name)
	if err != nil {
		return "", err
	}
	if local != nil && local.State == manager.SnapReady {
		known := rec.SnapshotID == "" && m == nil
		if local.ID == rec.SnapshotID || (m != nil && local.ID == m.SnapshotID) || known {
			return local.ID, nil
		}
	}
	if m == nil {
		return "", fmt.Errorf("no hibernate snapshot %s locally or in the registry (refusing fresh boot)", name)
	}
	file, err := a.fetchSnapshot(ctx, m)
	if a.cfg.RegistryURL != "" {
		defer os.Remove(file)
	}
	if err != nil {
		return "", err
	}
	if local != nil {
		if err := a.removeSnapshot(ctx, name, local.ID, true); err != nil {
			return "", fmt.Errorf("pull %s: unverified local snapshot %s: %w", name, local.ID, err)
		}
	}
	if _, err := a.call(ctx, name, manager.Call{Verb: manager.VerbImport, Name: name, File: file}); err != nil {
		return "", fmt.Errorf("pull %s: %w", name, err)
	}
	s, err := a.snapshotByName(ctx, name)
	if err != nil {
		return "", err
	}
	if s == nil || s.State != manager.SnapReady {
		return "", fmt.Errorf("pull %s: imported snapshot not found", name)
	}
	return s.ID, nil
}

// fetchSnapshot makes the export archive m names readable locally and
// verified: the registry dir's file checked against its digest, or the OCI
// artifact's blobs downloaded (each verified) into a temp archive.
func (a *Agent) fetchSnapshot(ctx context.Context, m *registryManifest) (string, error) {
	name := m.Name
	if a.cfg.RegistryURL != "" {
		a.dropStaging(name)
		tmp := filepath.Join(a.cfg.RegistryDir, fmt.Sprintf(".%s.pull-%d", name, time.Now().UnixNano()))
		if err := hit(ctx, "agent.pull.manifest", name, "pull"); err != nil {
			return tmp, err
		}
		return tmp, a.ociFetch(ctx, m, tmp)
	}
	file := filepath.Join(a.cfg.RegistryDir, m.File)
	sum, _, err := fileDigest(file)
	if err != nil {
		return "", fmt.Errorf("pull %s: %w", name, err)
	}
	if sum != m.SHA256 {
		return "", fmt.Errorf("pull %s: %s digest %s does not match the manifest's %s", name, m.File, sum, m.SHA256)
	}
	return file, nil
}

// ErrImageChanged is the identity guard's refusal (seed 001: a changed
// image restored the old snapshot with no event and no metric).
var ErrImageChanged = errors.New("hibernate snapshot taken from another image")

// imageGuard (docs/architecture.md §6) refuses to restore a hibernate snapshot into an intent whose
// image (source snapshot) is not the one the snapshot was taken from: the
// restore would silently bring back the old image, and a fresh boot would
// destroy the snapshot's memory, so the agent fails closed and says why
// (reason image_changed) until the image is restored or the VM deleted.
// Every path that restores reads the registry entry first, so the guard
// cannot be skipped by how the wake was reached (a create that found the
// snapshot, a wake, a resumed wake).
func imageGuard(rec *record, m *registryManifest) error {
	if m == nil || m.Image == "" || m.Image == rec.Intent.Snapshot || regress.On("image-guard-off") {
		return nil
	}
	return opErr(reasonImageChanged, fmt.Errorf("%w: %s:%s was taken from image %q, the intent names %q "+
		"(refusing to restore it into another image, refusing fresh boot): put the intent back on %q, or delete the VM",
		ErrImageChanged, rec.Name, ociTag, m.Image, rec.Intent.Snapshot, m.Image))
}

// hibernateEvidence reports whether a hibernate snapshot of name exists in
// the registry or locally. Every lookup is counted by verdict.
func (a *Agent) hibernateEvidence(ctx context.Context, name string) (bool, error) {
	if err := a.registryHas(ctx, name); err == nil {
		a.metrics.inc(mEvidence, "registry")
		return true, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		a.metrics.inc(mEvidence, "error")
		if regress.On("evidence-error-boots-fresh") {
			return false, nil // the historical reading: unreadable means none
		}
		return false, err
	}
	s, err := a.snapshotByName(ctx, name)
	if err != nil {
		a.metrics.inc(mEvidence, "error")
		return false, err
	}
	if s != nil {
		a.metrics.inc(mEvidence, "local")
		return true, nil
	}
	a.metrics.inc(mEvidence, "none")
	return false, nil
}

// dropHibernateSnapshot removes name's hibernate snapshot locally (by id,
// pending records included) and from the registry.
func (a *Agent) dropHibernateSnapshot(ctx context.Context, name, id string) error {
	if err := a.dropLocalHibernateSnapshot(ctx, name, id); err != nil {
		return err
	}
	return a.dropRegistry(ctx, name)
}

// dropLocalHibernateSnapshot removes name's hibernate snapshot from the
// node only (by id, then whatever snapshot still holds the name).
func (a *Agent) dropLocalHibernateSnapshot(ctx context.Context, name, id string) error {
	if id != "" {
		if err := a.removeSnapshot(ctx, name, id, true); err != nil {
			return err
		}
	}
	s, err := a.snapshotByName(ctx, name)
	if err != nil {
		return err
	}
	if s != nil {
		if err := a.removeSnapshot(ctx, name, s.ID, true); err != nil {
			return err
		}
	}
	return nil
}

// registryHas is nil when name has a registry entry, os.ErrNotExist when
// it has none, another error when the registry could not answer.
func (a *Agent) registryHas(ctx context.Context, name string) error {
	if a.cfg.RegistryURL != "" {
		_, err := a.ociReadManifest(ctx, name)
		return err
	}
	_, err := os.Stat(a.manifestPath(name))
	return err
}

// collectAfterKilledSave asks the manager to collect its garbage once a save
// child died of a signal: the dead save's capture (vmctl: the VM's
// snapshot-<id> dir) is reclaimed by the VM's next save or by gc, and when no
// next save comes (a wake cancels the hibernate) nothing else runs gc. A
// manager without gc keeps it; that is its own to answer for.
func (a *Agent) collectAfterKilledSave(ctx context.Context, vm string, err error) {
	var ce *ChildError
	if regress.On("killed-save-not-collected") || !errors.As(err, &ce) || !ce.Killed || ctx.Err() != nil ||
		!manager.Supported(a.adapter(), manager.VerbGC) {
		return
	}
	if _, gerr := a.call(ctx, vm, manager.Call{Verb: manager.VerbGC}); gerr != nil {
		a.log.Warn("gc after a killed save failed", "vm", vm, "err", gerr)
		return
	}
	a.log.Info("gc after a killed save: the dead save's capture collected", "vm", vm)
}
