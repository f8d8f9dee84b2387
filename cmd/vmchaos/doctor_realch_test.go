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
