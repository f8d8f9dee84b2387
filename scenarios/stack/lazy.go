package stack

import (
	"fmt"

	"github.com/vmchaos/vmchaos/injector"
)

// Unmounter detaches a stack's lazy filesystems at teardown.
type Unmounter interface{ Unmount() error }

// LazyMount mounts durable dirs as lazy filesystems (attached in the mount
// namespaces nss too) and names volatile dirs a power cut empties; the
// runner passes powercut.MountIn (this package cannot import powercut,
// whose tests build stacks).
type LazyMount func(durable, volatile, nss []string) (Unmounter, error)

// DurableDirs are what survives a reboot of the node: vmctl's root (the
// guests' disks with it), the agent's state dir and the registry.
func (s *Stack) DurableDirs() []string { return []string{s.Root, s.State, s.Registry} }

// VolatileDirs are what a reboot empties (/run on a node): the VMMs'
// sockets and pid files.
func (s *Stack) VolatileDirs() []string { return []string{s.RunDir} }

func (s *Stack) mountLazy(mount LazyMount) error {
	var nss []string
	if ns := injector.MountNS(s.run.Sup); ns != "" {
		nss = append(nss, ns)
	}
	u, err := mount(s.DurableDirs(), s.VolatileDirs(), nss)
	if err != nil {
		return fmt.Errorf("stack: lazy filesystems: %w", err)
	}
	s.Lazy = u
	return nil
}
