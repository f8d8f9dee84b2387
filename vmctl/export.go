package vmctl

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
)

// maxImportFile bounds one file of an imported archive (guest RAM and disk
// of big VMs are large, but an archive is outside input).
const maxImportFile = 64 << 30

// SnapshotExport writes a snapshot as a tar stream (vmctl.json first) under
// the shared lease, so it cannot be removed while being read.
func (m *Manager) SnapshotExport(ctx context.Context, ref string, w io.Writer) error {
	s, err := m.resolveSnap(ref)
	if err != nil {
		return err
	}
	if s.State != SnapReady {
		return fmt.Errorf("export: snapshot %s is %s", s.ID, s.State)
	}
	lease, err := m.readLease(ctx, "export", s.ID)
	if err != nil {
		return err
	}
	defer lease.Unlock()
	if _, err := m.resolveSnap(s.ID); err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	for _, name := range snapFiles {
		p := filepath.Join(s.Dir, name)
		f, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) && name == "memory-ranges" {
			continue
		}
		if err != nil {
			return fmt.Errorf("export %s: %w", s.ID, err)
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return err
		}
		hdr := &tar.Header{Name: name, Mode: 0o600, Size: fi.Size(), ModTime: fi.ModTime(), Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			f.Close()
			return fmt.Errorf("export %s: %w", s.ID, err)
		}
		_, err = io.Copy(tw, f)
		f.Close()
		if err != nil {
			return fmt.Errorf("export %s: %w", s.ID, err)
		}
	}
	return tw.Close()
}

// readArchive unpacks an export stream into dir, accepting only the known
// snapshot file names, regular files, once each.
func readArchive(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	seen := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("import: archive: %w", err)
		}
		if hdr.Typeflag != tar.TypeReg || !slices.Contains(snapFiles, hdr.Name) || seen[hdr.Name] {
			return fmt.Errorf("import: archive: unexpected entry %q", hdr.Name)
		}
		if hdr.Size < 0 || hdr.Size > maxImportFile {
			return fmt.Errorf("import: archive: entry %q too large", hdr.Name)
		}
		seen[hdr.Name] = true
		f, err := os.OpenFile(filepath.Join(dir, hdr.Name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("import: %w", err)
		}
		_, err = io.Copy(f, io.LimitReader(tr, hdr.Size))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("import: %w", err)
		}
	}
	for _, need := range []string{snapMetaFile, "config.json", "state.json", snapDiskFile} {
		if !seen[need] {
			return fmt.Errorf("import: archive lacks %s", need)
		}
	}
	if _, err := readMeta(dir); err != nil {
		return fmt.Errorf("import: %w", err)
	}
	return nil
}

// SnapshotImport reads an export stream into a new snapshot (named name, or
// the name recorded in the archive), through the same pending → finalized
// protocol as save.
func (m *Manager) SnapshotImport(ctx context.Context, r io.Reader, name string) (*Snapshot, error) {
	sid := newID()
	lease, err := lockFile(ctx, m.leasePath(sid), exclusive, false)
	if err != nil {
		return nil, fmt.Errorf("import %s: lease: %w", sid, err)
	}
	defer lease.Unlock()
	staging := m.stagingFor(sid)
	if err := os.MkdirAll(staging, 0o755); err != nil {
		return nil, err
	}
	if err := readArchive(r, staging); err != nil {
		_ = os.RemoveAll(staging)
		return nil, err
	}
	meta, err := readMeta(staging)
	if err != nil {
		_ = os.RemoveAll(staging)
		return nil, err
	}
	if name == "" {
		name = meta.Name
	}
	if name == "" {
		name = sid
	}
	if err := m.namePreflight(name); err != nil {
		_ = os.RemoveAll(staging)
		return nil, fmt.Errorf("import: %w", err)
	}
	if meta.Name != name {
		meta.Name = name
		if err := writeJSON(filepath.Join(staging, snapMetaFile), meta); err != nil {
			_ = os.RemoveAll(staging)
			return nil, err
		}
	}
	m.logf("import %s: unpacked", sid)
	return m.publish(ctx, sid, name, meta.SourceVM, sid)
}
