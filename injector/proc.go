package injector

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/internal/procstat"
)

// Proc identifies one process for its whole life: a pid alone may be reused
// after the process is reaped, the pair (pid, start time) never is.
type Proc struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"` // field 22 of /proc/PID/stat: clock ticks after boot
}

// ErrNotOwned is returned when the harness is asked to signal a process it did
// not start and that does not descend from one it started.
var ErrNotOwned = errors.New("not a process this harness started or a descendant of one")

// ErrGone is returned when the identified process no longer exists (it exited,
// or its pid now belongs to a different process).
var ErrGone = errors.New("process gone (exited or pid reused)")

// procStat is the part of /proc/PID/stat the injector uses.
type procStat struct {
	comm  string
	state byte
	ppid  int
	sid   int
	flags uint64 // the kernel's PF_* task flags
	start uint64
}

func readStat(pid int) (procStat, error) {
	st, err := procstat.Read(pid)
	return fromProcstat(st), err
}

func fromProcstat(st procstat.Stat) procStat {
	return procStat{comm: st.Comm, state: st.State, ppid: st.PPID, sid: st.SID, flags: st.Flags, start: st.Start}
}

// Stat is the part of /proc/PID/stat other packages need (the stack's
// process scans), read with the same parser the injector trusts.
type Stat struct {
	State byte   // R, S, D, Z, ...
	PPID  int    // parent, as this pid namespace sees it
	Start uint64 // start time in clock ticks since boot: with PID, an identity
}

// ReadStat reads /proc/PID/stat.
func ReadStat(pid int) (Stat, error) {
	st, err := readStat(pid)
	if err != nil {
		return Stat{}, err
	}
	return Stat{State: st.state, PPID: st.ppid, Start: st.start}, nil
}

// Identify returns the identity of the process now holding pid.
func Identify(pid int) (Proc, error) {
	if pid <= 0 {
		return Proc{}, fmt.Errorf("identify pid %d: invalid pid", pid)
	}
	st, err := readStat(pid)
	if err != nil {
		return Proc{}, fmt.Errorf("identify pid %d: %w", pid, ErrGone)
	}
	return Proc{PID: pid, Start: st.start}, nil
}

// Alive reports whether this very process still exists and is not a zombie.
func (p Proc) Alive() bool {
	st, err := readStat(p.PID)
	return err == nil && st.start == p.Start && st.state != 'Z' && st.state != 'X'
}

// Exists reports whether this very process still exists (zombies included).
func (p Proc) Exists() bool {
	st, err := readStat(p.PID)
	return err == nil && st.start == p.Start
}

// PidFD is an open pidfd verified to refer to one Proc.
type PidFD struct {
	Proc
	fd int
}

// OpenPidFD opens a pidfd for p and checks, after opening, that the pid still
// belongs to p: from then on the fd cannot refer to any other process.
func OpenPidFD(p Proc) (*PidFD, error) {
	fd, err := unix.PidfdOpen(p.PID, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", p.PID, ErrGone)
	}
	st, err := readStat(p.PID)
	if err != nil || st.start != p.Start {
		unix.Close(fd)
		return nil, fmt.Errorf("pid %d: %w", p.PID, ErrGone)
	}
	return &PidFD{Proc: p, fd: fd}, nil
}

// Signal sends sig through the pidfd.
func (f *PidFD) Signal(sig syscall.Signal) error {
	if err := unix.PidfdSendSignal(f.fd, sig, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("signal %v to pid %d: %w", sig, f.PID, ErrGone)
		}
		return fmt.Errorf("signal %v to pid %d: %w", sig, f.PID, err)
	}
	return nil
}

// Exited reports whether the process has exited (pidfd readable).
func (f *PidFD) Exited() bool {
	fds := []unix.PollFd{{Fd: int32(f.fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0
}

// WaitExit waits until the process has exited or ctx ends.
func (f *PidFD) WaitExit(ctx context.Context) error {
	for {
		fds := []unix.PollFd{{Fd: int32(f.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 20)
		if err == nil && n > 0 {
			return nil
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait pid %d: %w", f.PID, err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("wait pid %d exit: %w", f.PID, ctx.Err())
		}
	}
}

// Close releases the pidfd.
func (f *PidFD) Close() error { return unix.Close(f.fd) }

// signalProc signals p through a verified pidfd.
func signalProc(p Proc, sig syscall.Signal) error {
	fd, err := OpenPidFD(p)
	if err != nil {
		return err
	}
	defer fd.Close()
	return fd.Signal(sig)
}

// nsPIDs returns the NSpid line of /proc/PID/status: the pid in every nested
// pid namespace, outermost (the reader's) first.
func nsPIDs(pid int) []int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil
	}
	for _, ln := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(ln, "NSpid:"); ok {
			var out []int
			for _, f := range strings.Fields(rest) {
				n, err := strconv.Atoi(f)
				if err != nil {
					return nil
				}
				out = append(out, n)
			}
			return out
		}
	}
	return nil
}

// pidNS returns the pid namespace of pid ("pid:[4026531836]").
func pidNS(pid int) string {
	s, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/pid")
	return s
}

// cmdline returns the argv of pid.
func cmdline(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// environHas reports whether the initial environment of pid holds kv.
//
// A process in the middle of execve shows an empty environ for a moment: the
// kernel installs the new mm before it sets the mm's env range (fs/exec.c
// begin_new_exec, then create_elf_tables), and /proc/PID/environ reads nothing
// while env_end is 0. A scan that met a unit's child then would miss it, so an
// empty environ is read again while the process is in that window (midExec).
func environHas(pid int, kv string) bool {
	path := "/proc/" + strconv.Itoa(pid) + "/environ"
	b, err := os.ReadFile(path)
	for try := 0; err == nil && len(b) == 0 && try < 100 && midExec(pid); try++ {
		time.Sleep(time.Millisecond)
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return false
	}
	for _, e := range bytes.Split(b, []byte{0}) {
		if string(e) == kv {
			return true
		}
	}
	return false
}

// pfKthread is PF_KTHREAD from include/linux/sched.h.
const pfKthread = 0x00200000

// midExec reports whether pid, whose environ just read empty, is in the
// execve window: its cmdline reads empty too (fs/proc/base.c get_mm_cmdline
// returns nothing while env_end is 0), and it is a live user process. A
// process that truly has no environment (a PID 1 started with none) still has
// its argv, so it is answered at once; so are kernel threads and zombies.
func midExec(pid int) bool {
	if len(cmdline(pid)) > 0 {
		return false
	}
	st, err := readStat(pid)
	return err == nil && st.flags&pfKthread == 0 && st.state != 'Z' && st.state != 'X'
}

// allPIDs lists every pid in /proc.
func allPIDs() []int {
	ents, _ := os.ReadDir("/proc")
	out := make([]int, 0, len(ents))
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// childrenOf lists the children of pid across all its threads (a reparented
// orphan may be attached to any thread of a subreaper).
// Children lists pid's child processes (every thread's).
func Children(pid int) []int { return childrenOf(pid) }

func childrenOf(pid int) []int {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// descendsFrom reports whether p's parent chain reaches ancestor.
func descendsFrom(pid, ancestor int) bool {
	for i := 0; i < 256 && pid > 1; i++ {
		st, err := readStat(pid)
		if err != nil {
			return false
		}
		if st.ppid == ancestor {
			return true
		}
		pid = st.ppid
	}
	return false
}
