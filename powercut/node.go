// Package powercut cuts the power of a node's stack: every process at once,
// then everything its lazy filesystems hold that was never made durable,
// then a fresh mount of what survived and an empty /run, as after a reboot.
// The runner's `power-cut` fault is to be built on it (docs/lazyfs.md).
package powercut

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// Mount makes each durable dir (created if missing) a lazy filesystem.
func Mount(durable, volatile []string) (*Node, error) {
	n := &Node{Durable: durable, Volatile: volatile}
	for _, d := range durable {
		if err := os.MkdirAll(d, 0o755); err != nil {
			n.Unmount()
			return nil, fmt.Errorf("power cut: %w", err)
		}
		m, err := lazyfs.Mount(d, lazyfs.NewTree())
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
		errs = append(errs, m.Unmount())
	}
	n.mounts = nil
	return errors.Join(errs...)
}

// Cut is the power cut: SIGSTOP every process at once (nothing written after
// this instant counts), SIGKILL them and wait until they are gone, drop what
// is not durable and mount the survivors again, and empty the volatile
// dirs. Processes are signalled through verified pidfds only; one that has
// already exited is skipped.
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
	for _, f := range fds {
		_ = f.Signal(syscall.SIGKILL)
	}
	for _, f := range fds {
		if err := f.WaitExit(ctx); err != nil {
			return fmt.Errorf("power cut: pid %d did not die: %w", f.Proc.PID, err)
		}
	}
	for i, m := range n.mounts {
		nm, err := m.PowerCut()
		if err != nil {
			return fmt.Errorf("power cut: %w", err)
		}
		n.mounts[i] = nm
	}
	for _, d := range n.Volatile {
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
