package needs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFind(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "cocoon")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	oldLook, oldEnv := lookPath, getenv
	t.Cleanup(func() { lookPath, getenv = oldLook, oldEnv })
	for _, tc := range []struct {
		name, env, onPath    string
		path, skip, errWords string
	}{
		{name: "env wins", env: exe, onPath: "/usr/bin/cocoon", path: exe},
		{name: "PATH when env unset", onPath: "/usr/bin/cocoon", path: "/usr/bin/cocoon"},
		{name: "neither skips naming both", skip: "missing binary: VMCHAOS_COCOON not set and no cocoon on PATH: build it"},
		{name: "env not executable fails", env: plain, errWords: "VMCHAOS_COCOON=" + plain + ": not an executable file"},
		{name: "env missing file fails", env: filepath.Join(dir, "nope"), errWords: "not an executable file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			getenv = func(string) string { return tc.env }
			lookPath = func(string) (string, error) {
				if tc.onPath == "" {
					return "", errors.New("not found")
				}
				return tc.onPath, nil
			}
			path, skip, err := find("VMCHAOS_COCOON", "cocoon", "build it")
			if tc.errWords != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errWords) {
					t.Fatalf("err %v, want one naming %q", err, tc.errWords)
				}
				return
			}
			if err != nil || path != tc.path || skip != tc.skip {
				t.Errorf("find = (%q, %q, %v), want (%q, %q, nil)", path, skip, err, tc.path, tc.skip)
			}
		})
	}
	getenv = func(string) string { return "" }
	lookPath = func(string) (string, error) { return "", errors.New("not found") }
	if _, skip, _ := find("", "qemu-img", "apt install qemu-utils"); skip != "missing binary: no qemu-img on PATH: apt install qemu-utils" {
		t.Errorf("no env: skip %q", skip)
	}
}
