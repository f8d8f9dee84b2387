package stack

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vmchaos/vmchaos/injector"
)

// Proc is one process of the case as /proc shows it.
type Proc struct {
	PID   int
	PPID  int
	Start uint64
	Argv  []string
	// NSPID is the pid as the process's own pid namespace sees it (the
	// innermost NSpid; what a manager inside a sandbox records), where
	// read: 0 when not asked for.
	NSPID int
}

// Is reports whether pid, as a manager recorded it, names this process: its
// host pid, or its pid in its own namespace.
func (p Proc) Is(pid int) bool { return pid > 0 && (pid == p.PID || pid == p.NSPID) }

func (p Proc) String() string { return fmt.Sprintf("pid %d %s", p.PID, strings.Join(p.Argv, " ")) }

// Name is argv[0]'s basename.
func (p Proc) Name() string {
	if len(p.Argv) == 0 {
		return ""
	}
	return filepath.Base(p.Argv[0])
}

// Processes returns every live process that belongs to this case: its
// command line names the case's temp dir (VMMs name their api.sock under the
// run dir; the agent its state dir) or its environment carries the case's
// vmctl root (every vmctl the stack ran). The temp dir is unique per case, so
// a match is an identity, not a guess.
func (s *Stack) Processes() []Proc {
	out, _ := s.ScanProcesses()
	return out
}

// ScanProcesses is Processes that reports a /proc it could not list: the
// checker must not read "no process" from a scan that did not happen.
func (s *Stack) ScanProcesses() ([]Proc, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("scan /proc: %w", err)
	}
	self := os.Getpid()
	var out []Proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if p, ok := s.Identify(pid); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// Identify reads one live process and tells whether it belongs to this
// case: its command line names the case's temp dir or its environment
// carries the case's vmctl root.
func (s *Stack) Identify(pid int) (Proc, bool) {
	cl, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(cl) == 0 {
		return Proc{}, false // gone, or a kernel thread / zombie
	}
	mine := bytes.Contains(cl, []byte(s.Dir+"/"))
	if !mine {
		env, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
		mine = bytes.Contains(env, []byte("VMCTL_ROOT_DIR="+s.Root+"\x00"))
	}
	if !mine {
		return Proc{}, false
	}
	st, ok := stat(pid)
	if !ok || st.State == 'Z' {
		return Proc{}, false
	}
	argv := strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")
	return Proc{PID: pid, PPID: st.PPID, Start: st.Start, Argv: argv}, true
}

// stat reads pid's /proc stat through the injector's parser.
func stat(pid int) (injector.Stat, bool) {
	st, err := injector.ReadStat(pid)
	return st, err == nil
}

// signal sends sig to p through the injector's verified pidfd (opened, then
// checked against p's start time), so a reused pid is never hit.
func signal(p Proc, sig syscall.Signal) error {
	fd, err := injector.OpenPidFD(injector.Proc{PID: p.PID, Start: p.Start})
	if err != nil {
		return err
	}
	defer fd.Close()
	return fd.Signal(sig)
}

// killLeftovers SIGKILLs every process of the case until none is left (or 5 s).
func (s *Stack) killLeftovers() {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		ps := s.Processes()
		if len(ps) == 0 {
			return
		}
		for _, p := range ps {
			_ = signal(p, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// VMMs returns the case's cloud-hypervisor processes keyed by the VM id of
// their api socket (<run>/<ID>/api.sock).
func (s *Stack) VMMs() map[string]Proc {
	out := map[string]Proc{}
	for _, p := range s.Processes() {
		if p.Name() != "cloud-hypervisor" {
			continue
		}
		for _, a := range p.Argv {
			i := strings.Index(a, s.RunDir+"/")
			if i < 0 {
				continue
			}
			rest := a[i+len(s.RunDir)+1:]
			if id, _, ok := strings.Cut(rest, "/"); ok {
				out[id] = p
			}
		}
	}
	return out
}

// VmctlProcs returns the case's vmctl processes, minus those the harness
// itself keeps running (the observer).
func (s *Stack) VmctlProcs() []Proc {
	var out []Proc
	keep := s.HarnessPIDs()
	for _, p := range s.Processes() {
		if p.Name() == "vmctl" && !keep[p.PID] {
			out = append(out, p)
		}
	}
	return out
}

// HarnessPIDs are the case processes the harness itself keeps running (the
// event-stream observer, cocoon's network holder), which are not the
// product's.
func (s *Stack) HarnessPIDs() map[int]bool {
	keep := map[int]bool{}
	if s.Observer != nil && s.Observer.cmd.Process != nil {
		keep[s.Observer.cmd.Process.Pid] = true
	}
	if s.cocoonNet != nil {
		keep[s.cocoonNet.holder] = true
	}
	return keep
}

// KillVMM SIGKILLs the VMM of the VM with that id, the way an OOM kill does.
func (s *Stack) KillVMM(ctx context.Context, id string) (int, error) {
	p, ok := s.VMMs()[id]
	if !ok {
		return 0, fmt.Errorf("kill vmm: no cloud-hypervisor process for vm %s", id)
	}
	if err := signal(p, syscall.SIGKILL); err != nil {
		return p.PID, fmt.Errorf("kill vmm %s: %w", id, err)
	}
	for ctx.Err() == nil {
		if st, ok := stat(p.PID); !ok || st.Start != p.Start || st.State == 'Z' {
			return p.PID, nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return p.PID, ctx.Err()
}

// KillProc SIGKILLs a process the harness started (direct clone).
func KillProc(pid int) error {
	st, ok := stat(pid)
	if !ok {
		return fmt.Errorf("pid %d: gone", pid)
	}
	return signal(Proc{PID: pid, Start: st.Start}, syscall.SIGKILL)
}
