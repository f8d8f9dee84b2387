package lazyfs

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// A stack may run in mount namespaces of its own (the sandbox supervisor's
// private systemd): a mount made here after that namespace was created never
// propagates into it. MountIn attaches a clone of the mount (open_tree +
// move_mount) in each such namespace, at the same path, so the stack and the
// harness see one tree.

// MountIn is Mount, plus the same mount attached at dir in each mount
// namespace of nss (paths like /proc/PID/ns/mnt). PowerCut and Unmount keep
// and detach those too.
func MountIn(dir string, t *Tree, nss []string) (*Mounted, error) {
	m, err := Mount(dir, t)
	if err != nil {
		return nil, err
	}
	for _, ns := range nss {
		if err := attachIn(dir, ns); err != nil {
			_ = m.Unmount()
			return nil, fmt.Errorf("lazyfs: attach %s in %s: %w", dir, ns, err)
		}
		m.nss = append(m.nss, ns)
	}
	return m, nil
}

// attachIn clones the mount at dir and attaches the clone at dir inside
// mount namespace ns.
func attachIn(dir, ns string) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree: %w", err)
	}
	defer unix.Close(fd)
	return inMountNS(ns, func() error {
		if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("move_mount: %w", err)
		}
		return nil
	})
}

// detachIn lazily unmounts dir inside mount namespace ns.
func detachIn(dir, ns string) error {
	return inMountNS(ns, func() error {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && err != unix.EINVAL {
			return fmt.Errorf("umount %s in %s: %w", dir, ns, err)
		}
		return nil
	})
}

// inMountNS runs fn on a thread of its own that joined mount namespace ns.
// The thread is never handed back to the Go scheduler (its goroutine ends
// still locked, so the runtime ends the thread): nothing else ever runs in
// that namespace.
func inMountNS(ns string, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Go's threads share their fs context (CLONE_FS), which setns of a
		// mount namespace refuses: give this thread its own first.
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			done <- fmt.Errorf("unshare fs: %w", err)
			return
		}
		nfd, err := unix.Open(ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- fmt.Errorf("open %s: %w", ns, err)
			return
		}
		defer unix.Close(nfd)
		if err := unix.Setns(nfd, unix.CLONE_NEWNS); err != nil {
			done <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		done <- fn()
	}()
	return <-done
}

// AttachIn attaches a clone of the mount at dir (any file system, not only
// a lazy one) at dir inside mount namespace ns: the stack's other mounts
// (the registry's tmpfs) reach a sandboxed supervisor's namespace the same
// way. DetachIn undoes it.
func AttachIn(dir, ns string) error { return attachIn(dir, ns) }

// DetachIn lazily unmounts dir inside mount namespace ns.
func DetachIn(dir, ns string) error { return detachIn(dir, ns) }
