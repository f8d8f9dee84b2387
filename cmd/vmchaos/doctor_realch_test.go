package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// doctor's "ch" line is realch's discovery: ok only with binary (in range),
// payload and image; otherwise it names what is missing and where it looked.
func TestDoctorCHCheckIsDiscovery(t *testing.T) {
	dir := t.TempDir()
	ch := filepath.Join(dir, "cloud-hypervisor")
	if err := os.WriteFile(ch, []byte("#!/bin/sh\necho cloud-hypervisor v53.0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"vmlinuz", "initrd.img", "guest.raw"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("VMCHAOS_CH_BINARY", "")
	t.Setenv("VMCHAOS_FIRMWARE", "")
	t.Setenv("VMCHAOS_CH", ch)
	t.Setenv("VMCHAOS_KERNEL", filepath.Join(dir, "vmlinuz"))
	t.Setenv("VMCHAOS_INITRAMFS", filepath.Join(dir, "initrd.img"))
	t.Setenv("VMCHAOS_GUEST_IMAGE", filepath.Join(dir, "guest.raw"))
	c := chCheck(context.Background(), "cloud-hypervisor")
	if !c.OK || !strings.Contains(c.Detail, "v53.0") || !strings.Contains(c.Detail, "initrd.img") {
		t.Fatalf("everything present: %+v", c)
	}

	t.Setenv("VMCHAOS_GUEST_IMAGE", filepath.Join(dir, "nope.raw"))
	t.Setenv("VMCHAOS_CH", filepath.Join(dir, "no-ch"))
	c = chCheck(context.Background(), "cloud-hypervisor")
	if c.OK || !strings.Contains(c.Detail, "VMCHAOS_CH="+filepath.Join(dir, "no-ch")) || !strings.Contains(c.Detail, "nope.raw") {
		t.Fatalf("binary and image missing: %+v", c)
	}

	if err := os.WriteFile(ch, []byte("#!/bin/sh\necho cloud-hypervisor v39.0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("VMCHAOS_CH", ch)
	t.Setenv("VMCHAOS_GUEST_IMAGE", filepath.Join(dir, "guest.raw"))
	if c = chCheck(context.Background(), "cloud-hypervisor"); c.OK || !strings.Contains(c.Detail, "v39.0") {
		t.Fatalf("old release: %+v", c)
	}
}

// On a kvm_pvm host doctor names what is missing: a PVM guest kernel unless
// the discovered one is, and a CH that snapshots unless it does.
func TestPVMHostNeeds(t *testing.T) {
	snap := "snapshot-needs-nested-state: cloud-hypervisor v53.0 (≥ v49, PR #7380) calls KVM_GET_NESTED_STATE, which this kvm_pvm host does not support (KVM_CAP_NESTED_STATE = 0)"
	pvmKernel := "/k/vmlinux (elf): PVM guest yes: CONFIG_PVM_GUEST=y, CONFIG_X86_PIE=y"
	stock := "/k/vmlinux (elf): PVM guest no: CONFIG_PVM_GUEST is not y, CONFIG_X86_PIE is not y (a PVM host needs both, from the virt-pvm tree)"
	for _, tc := range []struct {
		name, snapshot, kernel string
		want, not              []string
	}{
		{"nothing known", snap, "", []string{"a PVM guest kernel (CONFIG_PVM_GUEST=y and CONFIG_X86_PIE=y", "a cloud-hypervisor before v49, or one that checks KVM_CAP_NESTED_STATE", snap}, []string{"discovered kernel"}},
		{"stock kernel, old CH", "", stock, []string{"a PVM guest kernel", "the discovered kernel: " + stock}, []string{"before v49"}},
		{"PVM kernel, v53", snap, pvmKernel, []string{"before v49", snap}, []string{"a PVM guest kernel"}},
	} {
		got := pvmHostNeeds(tc.snapshot, tc.kernel)
		if !strings.HasPrefix(got, "this kvm_pvm host needs ") {
			t.Errorf("%s: %q", tc.name, got)
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tc.name, got, w)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(got, n) {
				t.Errorf("%s: %q has %q", tc.name, got, n)
			}
		}
	}
	if got := pvmHostNeeds("", pvmKernel); got != "" {
		t.Errorf("PVM kernel and a CH that snapshots: %q, want nothing", got)
	}
}
