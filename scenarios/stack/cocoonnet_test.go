package stack

import (
	"os"
	"path/filepath"
	"testing"
)

// TestInRootResolvesLinksInsideTheRoot: /var/run → /run under another
// root must lead to that root's /run, as the process there sees it.
func TestInRootResolvesLinksInsideTheRoot(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"run/netns", "var"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/run", filepath.Join(root, "var", "run")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../run", filepath.Join(root, "rel")); err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		"/var/run/netns/cocoon-X": root + "/run/netns/cocoon-X",
		"/rel/netns":              root + "/run/netns",
		"/run/netns":              root + "/run/netns",
	} {
		if got, err := inRoot(root, in); err != nil || got != want {
			t.Errorf("inRoot(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
	if err := os.Symlink("loop", filepath.Join(root, "loop")); err != nil {
		t.Fatal(err)
	}
	if _, err := inRoot(root, "/loop/x"); err == nil {
		t.Error("a symlink loop resolved")
	}
	if _, err := inRoot(root, "relative"); err == nil {
		t.Error("a relative path resolved")
	}
}
