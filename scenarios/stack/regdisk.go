package stack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/lazyfs"
)

// RegistryDiskSize is the size of the registry's tmpfs: room for a few
// snapshot artifacts of the fake backend (a tmpfs takes memory only for
// what is written).
const RegistryDiskSize = 256 << 20

// tmpfsFlags are the mount flags of the registry's tmpfs, given again on
// every remount (a remount without them would clear them).
const tmpfsFlags = unix.MS_NOSUID | unix.MS_NODEV

// RegistryDisk is the registry's storage dir on a tmpfs of its own
// (injector.Disk: the registry-storage-full fault). Fill remounts it at the
// size it uses now, so the next block the registry asks for fails with
// ENOSPC; Heal remounts it at its full size. The mount lies below the
// case's temp dir, which the run record names: a runner killed with it
// mounted leaves a mount the census counts and `doctor --clean` unmounts.
type RegistryDisk struct {
	Dir  string
	size int64
	nss  []string // mount namespaces it is attached in (a sandbox's)

	mu       sync.Mutex
	full     bool
	healedNs int64 // the last heal (CLOCK_MONOTONIC); 0: never healed
	healErr  error
}

// mountRegistryDisk mounts a tmpfs of size bytes at dir and attaches it in
// each mount namespace of nss.
func mountRegistryDisk(dir string, size int64, nss []string) (*RegistryDisk, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("registry disk: %w", err)
	}
	if err := unix.Mount("vmchaos-registry", dir, "tmpfs", tmpfsFlags, "mode=0755,size="+strconv.FormatInt(size, 10)); err != nil {
		return nil, fmt.Errorf("registry disk: mount tmpfs at %s: %w", dir, err)
	}
	d := &RegistryDisk{Dir: dir, size: size}
	for _, ns := range nss {
		if err := lazyfs.AttachIn(dir, ns); err != nil {
			_ = d.Unmount()
			return nil, fmt.Errorf("registry disk: attach in %s: %w", ns, err)
		}
		d.nss = append(d.nss, ns)
	}
	return d, nil
}

// Fill remounts the tmpfs at the bytes it uses now (a page at least: size
// 0 is a tmpfs without a limit). A write of the registry between the read
// and the remount makes the remount fail (EINVAL: smaller than in use), so
// it reads again.
func (d *RegistryDisk) Fill(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var last error
	for range 50 {
		var st unix.Statfs_t
		if err := unix.Statfs(d.Dir, &st); err != nil {
			return fmt.Errorf("registry disk: statfs %s: %w", d.Dir, err)
		}
		used := max(int64(st.Blocks-st.Bfree)*st.Bsize, int64(os.Getpagesize()))
		last = unix.Mount("", d.Dir, "", unix.MS_REMOUNT|tmpfsFlags, "size="+strconv.FormatInt(used, 10))
		if last == nil {
			d.full = true
			return nil
		}
		if !errors.Is(last, unix.EINVAL) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return fmt.Errorf("registry disk: fill %s: %w", d.Dir, last)
}

// Heal remounts the tmpfs at its full size and stamps the heal.
func (d *RegistryDisk) Heal(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := unix.Mount("", d.Dir, "", unix.MS_REMOUNT|tmpfsFlags, "size="+strconv.FormatInt(d.size, 10))
	if err != nil {
		d.healErr = fmt.Errorf("registry disk: heal %s: %w", d.Dir, err)
		return d.healErr
	}
	d.full, d.healedNs, d.healErr = false, failpoint.Now(), nil
	return nil
}

// Healed is the time of the last heal once the disk is not full (0 while
// it is full or never healed), and the last heal's error.
func (d *RegistryDisk) Healed() (int64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.full {
		return 0, d.healErr
	}
	return d.healedNs, d.healErr
}

// Unmount detaches the tmpfs in every namespace it was attached in, then
// here (lazily: the registry's unit is gone, but a file it held open must
// not fail the teardown).
func (d *RegistryDisk) Unmount() error {
	var errs []error
	for _, ns := range d.nss {
		if err := lazyfs.DetachIn(d.Dir, ns); err != nil {
			errs = append(errs, err)
		}
	}
	d.nss = nil
	if err := unix.Unmount(d.Dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("registry disk: unmount %s: %w", d.Dir, err))
	}
	return errors.Join(errs...)
}
