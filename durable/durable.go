// Package durable holds the one helper every crash-safe write goes through:
// temp file, fsync, rename over the target, fsync of the directory. A reader
// therefore sees either the old or the new content, never a torn file, even if
// the writer is SIGKILLed at any instruction.
package durable

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile atomically replaces path with data.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("durable write %s: %w", path, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("durable write %s: %w", path, err)
	}
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("durable write %s: chmod: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("durable write %s: fsync: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("durable write %s: close: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("durable write %s: rename: %w", path, err)
	}
	ok = true
	return SyncDir(dir)
}

// SyncDir fsyncs a directory so that a rename or create inside it is durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}

// AppendLine appends one line (a newline is added) to path and fsyncs it before
// returning, so a caller may treat the line as recorded once this returns nil.
func AppendLine(path string, line []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("append %s: %w", path, err)
	}
	buf := make([]byte, 0, len(line)+1)
	buf = append(append(buf, line...), '\n')
	if _, err := f.Write(buf); err != nil {
		f.Close()
		return fmt.Errorf("append %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("append %s: fsync: %w", path, err)
	}
	return f.Close()
}
