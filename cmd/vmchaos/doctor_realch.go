package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/realch"
)

// The KVM part of `vmchaos doctor` comes from realch's preflight, so doctor
// and the real-backend specs skip for the same, precise reason.
func init() {
	kvmPreflight = kvmWithPVMNeeds
	chPreflight = realCHCheck
}

// kvmWithPVMNeeds is the KVM preflight, and on a kvm_pvm host what that host
// needs for the real backend (docs/realch.md "PVM hosts").
func kvmWithPVMNeeds() string {
	why := realch.KVMSkipReason()
	if !realch.IsPVMHost() {
		return why
	}
	_, pf, _ := realch.Preflight(realch.Options{})
	needs := pvmHostNeeds(pf.Snapshot, pf.Kernel)
	switch {
	case needs == "":
		return why
	case why == "":
		return "kvm-pvm (" + realch.EnvAllowPVM + "=1): " + needs
	}
	return why + "; " + needs
}

// pvmHostNeeds says what a kvm_pvm host lacks ("" = nothing): a PVM guest
// kernel (kernel is the preflight's verdict on the discovered one, "" when
// none), and a cloud-hypervisor that can snapshot there (snapshot is the
// preflight's nested-state reason, "" when the snapshot can work).
func pvmHostNeeds(snapshot, kernel string) string {
	var needs []string
	if !strings.Contains(kernel, ": PVM guest yes:") {
		n := "a PVM guest kernel (CONFIG_PVM_GUEST=y and CONFIG_X86_PIE=y, built from the virt-pvm tree as cocoonstack/pvm does; `vmchaos image real --kernel PATH` installs it)"
		if kernel != "" {
			n += "; the discovered kernel: " + kernel
		}
		needs = append(needs, n)
	}
	if snapshot != "" {
		needs = append(needs, "a cloud-hypervisor before v49, or one that checks KVM_CAP_NESTED_STATE before KVM_GET_NESTED_STATE, for the snapshot cases: "+snapshot)
	}
	if len(needs) == 0 {
		return ""
	}
	return "this kvm_pvm host needs " + strings.Join(needs, "; and ")
}

// chPreflight, when set, replaces the PATH-only "ch" check with realch's
// discovery: binary and version, boot payload and guest image.
var chPreflight func(ctx context.Context, bin string) injector.Check

// realCHCheck says `ch ok` only when everything the real backend boots is
// there, and otherwise names each missing item with where it looked.
func realCHCheck(_ context.Context, bin string) injector.Check {
	var o realch.Options
	if bin != realch.CHName {
		o.CHBinary = bin // --ch-binary given; the default leaves discovery its order
	}
	env, err := realch.Discover(o)
	var missing *realch.MissingError
	switch {
	case errors.As(err, &missing):
		items := missing.Items
		for i, it := range items {
			if strings.HasPrefix(it, "guest disk image") || strings.HasPrefix(it, "boot payload") {
				items[i] = it + " — `vmchaos image real` builds both"
			}
		}
		return injector.Check{Name: "ch", OK: false, Detail: "real backend: " + strings.Join(items, "; ") + " (only fakech runs)"}
	case err != nil:
		return injector.Check{Name: "ch", OK: false, Detail: err.Error()}
	}
	payload := "firmware " + env.Firmware
	if env.Kernel != "" {
		payload = "kernel " + env.Kernel
		if env.Initramfs != "" {
			payload += " + " + env.Initramfs
		}
	}
	return injector.Check{Name: "ch", OK: true, Detail: fmt.Sprintf("cloud-hypervisor %s (%s), %s, image %s", env.CHVersion, env.CHBinary, payload, env.Image)}
}
