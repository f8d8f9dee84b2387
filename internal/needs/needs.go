// Package needs lets a test say by name what it needs from the host (a
// binary, root) and skip with that name and how to provide it when the host
// lacks it, so that a skipped test is never read as a passed one (issue 31,
// "Skips say so"; docs/architecture.md §12).
package needs

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// lookPath and getenv are exec.LookPath and os.Getenv; the package's tests
// replace them.
var (
	lookPath = exec.LookPath
	getenv   = os.Getenv
)

// Binary is the program a test needs, found the way the product finds it:
// the path in the environment variable env when it is set (env "" for
// none), else name on PATH. When neither gives one the test skips with a
// message naming the variable, the program and howTo (how to provide it).
// A variable set to something that is not an executable file fails the
// test: the user asked for that binary and it is not there.
func Binary(t testing.TB, env, name, howTo string) string {
	t.Helper()
	path, skip, err := find(env, name, howTo)
	switch {
	case err != nil:
		t.Fatal(err)
	case skip != "":
		t.Skip(skip)
	}
	return path
}

// find is Binary's decision: the path, or why the test skips, or why it
// fails.
func find(env, name, howTo string) (path, skip string, err error) {
	if env != "" {
		if v := getenv(env); v != "" {
			if st, serr := os.Stat(v); serr != nil || st.IsDir() || st.Mode()&0o111 == 0 {
				return "", "", fmt.Errorf("%s=%s: not an executable file (%v): %s", env, v, serr, howTo)
			}
			return v, "", nil
		}
	}
	if p, lerr := lookPath(name); lerr == nil {
		return p, "", nil
	}
	if env != "" {
		return "", fmt.Sprintf("missing binary: %s not set and no %s on PATH: %s", env, name, howTo), nil
	}
	return "", fmt.Sprintf("missing binary: no %s on PATH: %s", name, howTo), nil
}

// Root skips a test that needs root, naming what for; run the package's
// tests as root (sudo -E go test ...) to run it.
func Root(t testing.TB, what string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("missing capability: %s needs root (uid %d): run `sudo -E go test` for this package", what, os.Geteuid())
	}
}
