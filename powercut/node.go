// Package powercut cuts the power of a node's stack: every process at once,
// then everything its lazy filesystems hold that was never made durable,
// then a fresh mount of what survived and an empty /run, as after a reboot.
// The runner's `power-cut` fault is built on it (docs/lazyfs.md).
package powercut

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/lazyfs"
)

// Node is the durable and volatile state of one stack: each of Durable is a
// lazyfs mount (the manager's root, the agent's state dir, the registry),
// each of Volatile a plain dir a reboot empties (the run dir: sockets, pid
// files — /run is a tmpfs on a real node).
type Node struct {
	Durable  []string
	Volatile []string
	mounts   []*lazyfs.Mounted
}

// A Node is what the injector's power-cut kind cuts (injector.Node): the
// kind lives in the injector's one list of fault kinds, and the lazy
// filesystems here, so powercut imports injector and never the reverse.
var _ injector.Node = (*Node)(nil)

// Mount makes each durable dir (created if missing) a lazy filesystem.
func Mount(durable, volatile []string) (*Node, error) {
	return MountIn(durable, volatile, nil)
}

// MountIn is Mount with every lazy filesystem also attached in the mount
// namespaces nss (lazyfs.MountIn: the stack's processes live there).
func MountIn(durable, volatile, nss []string) (*Node, error) {
	n := &Node{Durable: durable, Volatile: volatile}
	for _, d := range durable {
		if err := os.MkdirAll(d, 0o755); err != nil {
			n.Unmount()
			return nil, fmt.Errorf("power cut: %w", err)
		}
		m, err := lazyfs.MountIn(d, lazyfs.NewTree(), nss)
		if err != nil {
			n.Unmount()
			return nil, fmt.Errorf("power cut: %w", err)
		}
		n.mounts = append(n.mounts, m)
	}
	return n, nil
}

// Unmount detaches every lazy filesystem of the node (teardown).
func (n *Node) Unmount() error {
	var errs []error
	for _, m := range n.mounts {
		errs = append(errs, m.Detach())
	}
	waitReleased(n.mounts)
	n.mounts = nil
	return errors.Join(errs...)
}

// waitReleased waits for detached mounts all at once: a copy of a mount
// held by a namespace another run created meanwhile (a shared host) makes
// each wait run to its bound, and they must not add up.
func waitReleased(ms []*lazyfs.Mounted) {
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Go(m.WaitReleased)
	}
	wg.Wait()
}

// Cut is the power cut: SIGSTOP every process at once (nothing written after
// this instant counts); while they are frozen, drop what is not durable,
// mount the survivors again and empty the volatile dirs; then SIGKILL them
// and wait until they are gone. A supervisor that restarts a unit after its
// death (Restart=always: the boot starting it) therefore starts it on the
// rebooted node, never on the old one. Processes are signalled through
// verified pidfds only; one that has already exited is skipped.
func (n *Node) Cut(ctx context.Context, procs []injector.Proc) error {
	var fds []*injector.PidFD
	defer func() {
		for _, f := range fds {
			_ = f.Close()
		}
	}()
	for _, p := range procs {
		f, err := injector.OpenPidFD(p)
		if err != nil {
			continue // gone already
		}
		fds = append(fds, f)
	}
	for _, f := range fds {
		_ = f.Signal(syscall.SIGSTOP)
	}
	old := make([]*lazyfs.Mounted, 0, len(n.mounts))
	var cutErr error
	for i, m := range n.mounts {
		nm, err := m.CutFrozen()
		if err != nil {
			cutErr = fmt.Errorf("power cut: %w", err)
			break
		}
		old = append(old, m)
		n.mounts[i] = nm
	}
	if cutErr == nil {
		cutErr = emptyDirs(n.Volatile)
	}
	// killed even when the cut failed: a frozen stack must not outlive it
	for _, f := range fds {
		_ = f.Signal(syscall.SIGKILL)
	}
	for _, f := range fds {
		if err := f.WaitExit(ctx); err != nil {
			return fmt.Errorf("power cut: pid %d did not die: %w", f.Proc.PID, err)
		}
	}
	waitReleased(old)
	return cutErr
}

// emptyDirs removes everything inside each dir (/run after a reboot).
func emptyDirs(dirs []string) error {
	for _, d := range dirs {
		es, err := os.ReadDir(d)
		if err != nil {
			return fmt.Errorf("power cut: %w", err)
		}
		for _, e := range es {
			if err := os.RemoveAll(filepath.Join(d, e.Name())); err != nil {
				return fmt.Errorf("power cut: %w", err)
			}
		}
	}
	return nil
}
