package checker

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/vmchaos/vmchaos/manager"
	"golang.org/x/sys/unix"
)

// fileID is a file as the kernel names it in /proc/locks: device and inode.
// An inode number alone is only unique within one filesystem.
type fileID struct {
	Major, Minor uint32
	Ino          uint64
}

func (f fileID) String() string { return fmt.Sprintf("%x:%x:%d", f.Major, f.Minor, f.Ino) }

// Locks is one reading of /proc/locks: every held lock by the file it is on.
// Blocked waiters ("->") hold nothing and are left out.
type Locks map[fileID][]manager.Holder

// procLocks is where ReadLocks reads; tests point it elsewhere.
var procLocks = "/proc/locks"

// ReadLocks parses /proc/locks. The checker never takes a lock itself (that
// would change what it observes).
func ReadLocks() (Locks, error) {
	f, err := os.Open(procLocks)
	if err != nil {
		return nil, fmt.Errorf("read locks: %w", err)
	}
	defer f.Close()
	return parseLocks(f)
}

// parseLocks reads lines like "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"
// (device major:minor in hex, inode in decimal).
func parseLocks(r io.Reader) (Locks, error) {
	out := Locks{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 && fs[1] == "->" {
			continue
		}
		if len(fs) < 6 {
			return nil, fmt.Errorf("read locks: short line %q", sc.Text())
		}
		parts := strings.Split(fs[5], ":")
		if len(parts) != 3 {
			return nil, fmt.Errorf("read locks: bad file id in %q", sc.Text())
		}
		maj, err1 := strconv.ParseUint(parts[0], 16, 32)
		min, err2 := strconv.ParseUint(parts[1], 16, 32)
		ino, err3 := strconv.ParseUint(parts[2], 10, 64)
		pid, err4 := strconv.Atoi(fs[4])
		if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
			return nil, fmt.Errorf("read locks: bad line %q", sc.Text())
		}
		id := fileID{uint32(maj), uint32(min), ino}
		out[id] = append(out[id], manager.Holder{PID: pid, Kind: fs[1], Mode: fs[3]})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read locks: %w", err)
	}
	return out, nil
}

// statID names path by device and inode. A missing file is no error: nobody
// can hold a lock on it.
func statID(path string) (fileID, bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if os.IsNotExist(err) {
			return fileID{}, false, nil
		}
		return fileID{}, false, fmt.Errorf("stat %s: %w", path, err)
	}
	return fileID{unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)), st.Ino}, true, nil
}

// holders returns who holds a lock on path, matched by device and inode.
func (l Locks) holders(path string) ([]manager.Holder, error) {
	if path == "" {
		return nil, manager.ErrNotSupported
	}
	id, ok, err := statID(path)
	if err != nil || !ok {
		return nil, err
	}
	return l[id], nil
}

func describeHolders(hs []manager.Holder) string {
	var w []string
	for _, h := range hs {
		s := fmt.Sprintf("pid %d %s %s", h.PID, h.Kind, h.Mode)
		if len(h.Argv) > 0 {
			s += " (" + strings.Join(h.Argv, " ") + ")"
		} else {
			s += " (not a process of this case)"
		}
		w = append(w, s)
	}
	return strings.Join(w, ", ")
}
