// Package ownedtemp makes vmchaos-* temp dirs that belong to a process
// rather than to a run (stackbin's build dir of a `go test` run), and tells
// whether their owner still lives: the leak census skips a live owner's
// dir, `vmchaos doctor --clean` removes a dead owner's (docs/injector.md).
package ownedtemp

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vmchaos/vmchaos/internal/procstat"
)

// Prefix is what every vmchaos temp dir's name starts with.
const Prefix = "vmchaos-"

// ownerFile names the owner: its pid and start time, so a dead owner is
// told from a live process that reuses its pid.
const ownerFile = ".vmchaos-owner"

// Mkdir is os.MkdirTemp("", pattern) with this process as the dir's owner.
// pattern must start with Prefix.
func Mkdir(pattern string) (string, error) {
	if !strings.HasPrefix(pattern, Prefix) {
		return "", fmt.Errorf("owned temp dir %q: want a pattern %s*", pattern, Prefix)
	}
	self, err := procstat.Read(os.Getpid())
	if err != nil {
		return "", fmt.Errorf("owned temp dir: %w", err)
	}
	d, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(d, ownerFile), fmt.Appendf(nil, "%d %d\n", os.Getpid(), self.Start), 0o644); err != nil {
		os.RemoveAll(d)
		return "", fmt.Errorf("owned temp dir %s: %w", d, err)
	}
	return d, nil
}

// Owner reads d's owner. has is false for a dir without an owner file; an
// owner file that cannot be parsed is an error (the dir is then never
// removed on its word).
func Owner(d string) (pid int, start uint64, has bool, err error) {
	b, err := os.ReadFile(filepath.Join(d, ownerFile))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, 0, false, nil
	}
	if err != nil {
		return 0, 0, true, err
	}
	f := strings.Fields(string(b))
	bad := fmt.Errorf("%s: want \"PID START\", got %q", filepath.Join(d, ownerFile), b)
	if len(f) != 2 {
		return 0, 0, true, bad
	}
	pid, err1 := strconv.Atoi(f[0])
	start, err2 := strconv.ParseUint(f[1], 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 {
		return 0, 0, true, bad
	}
	return pid, start, true, nil
}

// State is what an owner file says of its dir.
type State int

const (
	Unowned   State = iota // no owner file: nothing proves its creator dead
	Live                   // its owner lives
	DeadOwner              // its owner is gone (exited, or its pid reused)
	BadOwner               // an owner file that cannot be read
)

// Of reads the state of d's owner.
func Of(d string) State {
	pid, start, has, err := Owner(d)
	switch {
	case !has:
		return Unowned
	case err != nil:
		return BadOwner
	}
	st, err := procstat.Read(pid)
	if err == nil && st.Start == start {
		return Live
	}
	return DeadOwner
}

// CleanDead removes the vmchaos-* entries of tempDirs (default
// os.TempDir()) whose owner is gone, and returns them. Dirs without an
// owner file are left alone: a run's dirs are its record's to clean.
func CleanDead(tempDirs []string) ([]string, error) {
	if len(tempDirs) == 0 {
		tempDirs = []string{os.TempDir()}
	}
	var removed []string
	var errs []error
	for _, t := range tempDirs {
		ents, _ := filepath.Glob(filepath.Join(t, Prefix+"*"))
		for _, d := range ents {
			if Of(d) != DeadOwner {
				continue
			}
			if err := os.RemoveAll(d); err != nil {
				errs = append(errs, fmt.Errorf("remove %s (its owner is gone): %w", d, err))
				continue
			}
			removed = append(removed, d)
		}
	}
	return removed, errors.Join(errs...)
}
