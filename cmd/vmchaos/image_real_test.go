package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --kernel is read before anything is built: an unreadable kernel stops the
// command with its path, before debootstrap could start.
func TestImageRealKernelIsReadFirst(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "no-vmlinux")
	c := newImageRealCmd()
	var out bytes.Buffer
	c.SetOut(&out)
	c.SetErr(&out)
	c.SetArgs([]string{"--kernel", missing, "-o", filepath.Join(dir, "out"), "--cache-dir", filepath.Join(dir, "cache"), "-q"})
	err := c.Execute()
	if err == nil || !strings.Contains(err.Error(), "image real --kernel") || !strings.Contains(err.Error(), missing) {
		t.Fatalf("missing kernel: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "cache")); !os.IsNotExist(err) {
		t.Errorf("the cache dir was touched before the kernel was read: %v", err)
	}
}

func TestInstallKernel(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "user-vmlinux"), filepath.Join(dir, "vmlinux")
	for p, b := range map[string]string{src: "user kernel", dst: "debian kernel, longer"} {
		if err := os.WriteFile(p, []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := installKernel(src, dst); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(dst); err != nil || string(b) != "user kernel" {
		t.Fatalf("installed %q, %v", b, err)
	}
	if _, err := os.Stat(dst + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary file left: %v", err)
	}
	if err := installKernel(filepath.Join(dir, "absent"), dst); err == nil {
		t.Error("absent source: no error")
	}
}
