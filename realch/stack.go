package realch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/vmnet"
)

// The vmctl environment variables StackEnv sets. vmctl reads each one as the
// default of the flag of the same name (docs/vmctl.md).
const (
	VarCHBinary   = "VMCTL_CH_BINARY"
	VarFirmware   = "VMCTL_FIRMWARE"
	VarKernel     = "VMCTL_KERNEL"
	VarCmdline    = "VMCTL_CMDLINE"
	VarInitramfs  = "VMCTL_INITRAMFS"
	VarNetMode    = "VMCTL_NET_MODE"
	VarNetPool    = "VMCTL_NET_POOL"
	VarSeedPubKey = "VMCTL_SEED_PUBKEY"
	VarNetns      = "VMCTL_NETNS"
	VarGuestNet   = "VMCTL_GUEST_NET"
)

// StackOptions say how a scenario stack (vmctl, and the nodeagent driving
// it) should run its VMs on a real cloud-hypervisor.
type StackOptions struct {
	// Options are the discovery inputs (binary, payload, image).
	Options
	// SeedPubKey is the authorized_keys line every guest's cloud-init seed
	// carries: the run's ledger key. Required.
	SeedPubKey string
	// Pool is the IPv4 CIDR vmctl carves one /30 per NIC from; default
	// vmnet.DefaultTapPool. It must not overlap a network the host routes.
	Pool string
	// Netns, when set, is the name of a network namespace StackEnv creates;
	// every VMM runs inside it (through a cloud-hypervisor wrapper written
	// to Dir), next to its TAP devices, and guests are reached through
	// Stack.Dial. Empty: VMMs and TAPs live in the host namespace.
	Netns string
	// Dir holds the wrapper (with Netns). It must exist; the caller owns it.
	Dir string
	// Cmdline overrides vmctl's kernel command line (kernel boots only).
	Cmdline string
	// DHCP runs a DHCP responder (vmnet.ServeDHCP) in the namespace (or the host
	// namespace without Netns) and has vmctl seed guests with DHCP instead
	// of a pinned address, so a clone under a new name (the agent's create
	// from a base snapshot) takes its own TAP's address.
	DHCP bool
}

// Stack is what the scenario runner needs to switch a stack to the real
// backend with one call: the environment to add, the image to create VMs
// from, and how to reach the guests.
type Stack struct {
	// Env is what discovery found.
	Env *Env
	// Vars are KEY=VALUE entries to append to the environment of every
	// process of the stack that runs vmctl (nodeagent passes its own
	// environment to its vmctl children).
	Vars []string
	// Image is the guest image to pass to `vmctl vm create|run`.
	Image string
	// Netns is the namespace the VMMs run in, or nil.
	Netns *vmnet.Netns
	// Dial reaches a guest address (ledger.Ledger.Dial): through the
	// namespace when there is one, else a plain dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// DHCP is the running responder (StackOptions.DHCP), or nil.
	DHCP *vmnet.DHCPResponder

	wrapper string
}

// StackEnv discovers the real backend and returns the environment that
// points vmctl at it: the CH binary (or a wrapper that runs it inside the
// namespace), the firmware or kernel, tap networking with its pool, and the
// seed key. It does not probe /dev/kvm (Preflight does; the real specs skip
// on its reason first). Close the Stack after every VMM of the stack is gone.
func StackEnv(o StackOptions) (*Stack, error) {
	key := strings.TrimSpace(o.SeedPubKey)
	if key == "" || strings.ContainsAny(key, "\r\n") {
		return nil, errors.New("realch: stack: SeedPubKey must be one authorized_keys line (the run's ledger key)")
	}
	pool := o.Pool
	if pool == "" {
		pool = vmnet.DefaultTapPool
	}
	p, err := netip.ParsePrefix(pool)
	if err != nil || !p.Addr().Is4() || p.Bits() > 30 || p.Bits() < 8 {
		return nil, fmt.Errorf("realch: stack: pool %q: want an IPv4 CIDR between /8 and /30", pool)
	}
	env, err := Discover(o.Options)
	if err != nil {
		return nil, fmt.Errorf("realch: stack: %w", err)
	}
	st := &Stack{Env: env, Image: env.Image}
	ch := env.CHBinary
	if o.Netns != "" {
		if o.Dir == "" {
			return nil, errors.New("realch: stack: Dir is required with Netns (the wrapper goes there)")
		}
		ns, err := vmnet.NewNetns(o.Netns)
		if err != nil {
			return nil, fmt.Errorf("realch: stack: %w", err)
		}
		if ch, err = ns.WriteCHWrapper(o.Dir, env.CHBinary); err != nil {
			_ = ns.Close()
			return nil, fmt.Errorf("realch: stack: %w", err)
		}
		st.Netns, st.wrapper, st.Dial = ns, ch, ns.DialContext
	} else {
		var d net.Dialer
		st.Dial = d.DialContext
	}
	st.Vars = append(st.Vars, VarCHBinary+"="+ch, VarNetMode+"=tap", VarNetPool+"="+p.Masked().String(), VarSeedPubKey+"="+key)
	if env.Firmware != "" {
		st.Vars = append(st.Vars, VarFirmware+"="+env.Firmware)
	} else {
		st.Vars = append(st.Vars, VarKernel+"="+env.Kernel)
		if env.Initramfs != "" {
			st.Vars = append(st.Vars, VarInitramfs+"="+env.Initramfs)
		}
		if o.Cmdline != "" {
			st.Vars = append(st.Vars, VarCmdline+"="+o.Cmdline)
		}
	}
	if st.Netns != nil {
		st.Vars = append(st.Vars, VarNetns+"="+st.Netns.Name)
	}
	if o.DHCP {
		if st.DHCP, err = vmnet.ServeDHCP(st.Netns); err != nil {
			_ = st.Close()
			return nil, fmt.Errorf("realch: stack: %w", err)
		}
		st.Vars = append(st.Vars, VarGuestNet+"=dhcp")
	}
	return st, nil
}

// Close deletes the namespace (and every TAP in it) and the wrapper. Stop
// the stack's VMMs first: a process left inside keeps the namespace alive.
func (s *Stack) Close() error {
	var errs []error
	if s.DHCP != nil {
		errs = append(errs, s.DHCP.Close())
	}
	if s.Netns != nil {
		errs = append(errs, s.Netns.Close())
	}
	if s.wrapper != "" {
		if err := os.Remove(s.wrapper); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		errs = append(errs, durable.SyncDir(filepath.Dir(s.wrapper)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("realch: stack close: %w", err)
	}
	return nil
}
