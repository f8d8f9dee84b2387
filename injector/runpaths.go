package injector

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// runPathPrefix starts the base name of every dir and namespace a run may
// ask doctor to remove: the registry is world-writable (1777), so a record
// alone is no licence to delete an arbitrary path.
const runPathPrefix = "vmchaos-"

// recorder is a supervisor that keeps a run record, with the lock its own
// later saves of that record take.
type recorder interface {
	record() (*Record, *sync.Mutex)
}

func (b *builtin) record() (*Record, *sync.Mutex) { return b.rec, &b.mu }
func (s *dbusSup) record() (*Record, *sync.Mutex) { return s.rec, &s.mu }

// RecordPaths adds to the run record of sup the dirs the run created (each
// an absolute dir named vmchaos-*, owned by this user) and the network
// namespaces (/run/netns/vmchaos-*), so that `doctor --clean`, or the next
// run, removes them once the runner is SIGKILLed. Call it before the dirs
// fill up: a record names what may be left, not what is.
func RecordPaths(sup Supervisor, dirs, netns []string) error {
	rs, ok := sup.(recorder)
	if !ok {
		return fmt.Errorf("record paths: supervisor %s keeps no run record", sup.Kind())
	}
	rec, mu := rs.record()
	for _, d := range dirs {
		if err := checkRunDir(d, os.Geteuid()); err != nil {
			return fmt.Errorf("record paths: %w", err)
		}
	}
	for _, n := range netns {
		if !validNetnsName(n) {
			return fmt.Errorf("record paths: netns %q: want a name %s*", n, runPathPrefix)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	rec.Paths = append(rec.Paths, dirs...)
	rec.Netns = append(rec.Netns, netns...)
	return rec.save()
}

// checkRunDir refuses anything but an absolute, clean, non-root dir named
// vmchaos-* (not a symlink) owned by uid.
func checkRunDir(d string, uid int) error {
	if !filepath.IsAbs(d) || filepath.Clean(d) != d || d == "/" || !strings.HasPrefix(filepath.Base(d), runPathPrefix) {
		return fmt.Errorf("dir %q: want an absolute path named %s*", d, runPathPrefix)
	}
	var st unix.Stat_t
	if err := unix.Lstat(d, &st); err != nil {
		return fmt.Errorf("dir %s: %w", d, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("dir %s: not a directory", d)
	}
	if int(st.Uid) != uid {
		return fmt.Errorf("dir %s: owned by uid %d, not %d", d, st.Uid, uid)
	}
	return nil
}

func validNetnsName(n string) bool {
	return strings.HasPrefix(n, runPathPrefix) && !strings.ContainsAny(n, "/\x00") && n != "." && n != ".."
}

const netnsDir = "/run/netns"

// presentPaths lists the recorded dirs and namespaces that still exist.
// A dir counts only if its owner is the record file's owner.
func presentPaths(r *Record, file string) (dirs, netns []string) {
	owner := -1
	var st unix.Stat_t
	if unix.Stat(file, &st) == nil {
		owner = int(st.Uid)
	}
	for _, d := range r.Paths {
		if checkRunDir(d, owner) == nil {
			dirs = append(dirs, d)
		}
	}
	for _, n := range r.Netns {
		if !validNetnsName(n) {
			continue
		}
		if _, err := os.Lstat(filepath.Join(netnsDir, n)); err == nil {
			netns = append(netns, n)
		}
	}
	return dirs, netns
}

// removeRunPaths removes a dead run's recorded dirs (after unmounting
// whatever is still mounted below them: a FUSE mount whose server died with
// the runner) and its namespaces, as `ip netns del` does.
func removeRunPaths(l Leftover) error {
	var errs []error
	for _, d := range l.Paths {
		for _, m := range mountsBelow(d) {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
			}
		}
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", d, err))
		}
	}
	for _, n := range l.Netns {
		p := filepath.Join(netnsDir, n)
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("netns %s: unmount: %w", n, err))
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("netns %s: %w", n, err))
		}
	}
	return errors.Join(errs...)
}

// mountsBelow lists the mount points at or below dir in this mount
// namespace, deepest first.
func mountsBelow(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, ln := range strings.Split(string(b), "\n") {
		f := strings.Fields(ln)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// KindReserve is the kind of a record that only names a dir about to be
// created (ReserveDir).
const KindReserve = "reserve"

// ReserveDir creates a new dir parent/prefix<random> (parent "" is the temp
// dir) after recording it in a run record of its own, so that a runner
// SIGKILLed at any moment, even before its supervisor exists, leaves a dir
// `doctor --clean` finds and removes. release removes that record: call it
// once the dir is named by the supervisor's record (RecordPaths) or removed.
func ReserveDir(parent, prefix string) (dir string, release func(), err error) {
	if !strings.HasPrefix(prefix, runPathPrefix) {
		return "", nil, fmt.Errorf("reserve dir: prefix %q: want %s*", prefix, runPathPrefix)
	}
	if parent == "" {
		parent = os.TempDir()
	}
	if parent, err = filepath.Abs(parent); err != nil {
		return "", nil, fmt.Errorf("reserve dir: %w", err)
	}
	rec, err := newRecord(KindReserve, "")
	if err != nil {
		return "", nil, fmt.Errorf("reserve dir: %w", err)
	}
	// The run id is random: the dir name is as unique as MkdirTemp's.
	dir = filepath.Join(parent, prefix+rec.RunID[len(rec.RunID)-16:])
	rec.Paths = []string{dir}
	if err := rec.save(); err != nil {
		return "", nil, fmt.Errorf("reserve dir: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		rec.remove()
		return "", nil, fmt.Errorf("reserve dir: %w", err)
	}
	return dir, rec.remove, nil
}

const fuseConnDir = "/sys/fs/fuse/connections"

// abortOrphanFuse aborts every FUSE connection that no mount namespace on
// this host still has mounted but that has requests waiting. That is a dead
// run's in-process FUSE server (lazyfs): SIGKILLed, the runner's exit closes
// a file on its own filesystem before the /dev/fuse fd that would answer
// the flush, and it and every unit with a file open there hang in D state
// (request_wait_answer) for ever. A connection mounted anywhere, or idle,
// is left alone. It returns the connections it aborted.
func abortOrphanFuse() []string {
	if ents, _ := os.ReadDir(fuseConnDir); len(ents) == 0 {
		_ = unix.Mount("fusectl", fuseConnDir, "fusectl", 0, "") // root only; harmless if it fails
	}
	conns, _ := os.ReadDir(fuseConnDir)
	if len(conns) == 0 {
		return nil
	}
	mounted := map[string]bool{}
	seenNS := map[string]bool{}
	for _, pid := range allPIDs() {
		p := "/proc/" + strconv.Itoa(pid)
		ns, err := os.Readlink(p + "/ns/mnt")
		if err != nil || seenNS[ns] {
			continue
		}
		seenNS[ns] = true
		b, _ := os.ReadFile(p + "/mountinfo")
		for _, ln := range strings.Split(string(b), "\n") {
			f := strings.Fields(ln)
			if len(f) > 2 && strings.Contains(ln, " - fuse") {
				if _, minor, ok := strings.Cut(f[2], ":"); ok {
					mounted[minor] = true
				}
			}
		}
	}
	var out []string
	for _, c := range conns {
		w, err := os.ReadFile(filepath.Join(fuseConnDir, c.Name(), "waiting"))
		if mounted[c.Name()] || err != nil || strings.TrimSpace(string(w)) == "0" {
			continue
		}
		if os.WriteFile(filepath.Join(fuseConnDir, c.Name(), "abort"), []byte("1"), 0) == nil {
			out = append(out, c.Name())
		}
	}
	return out
}
