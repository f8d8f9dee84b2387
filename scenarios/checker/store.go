package checker

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/scenarios/stack"
)

// NoLeftoverTempDirs is the manager-case invariant on the store's own dirs.
const NoLeftoverTempDirs = "no-leftover-temp-dirs"

// SrcStore is the listing of the manager's store dirs.
const SrcStore Source = "store listing"

// StoreListing is the manager's store as it was before the verb under test:
// its dirs (relative to the store) and the records it then had. A dir that
// appeared since is a leftover unless a record explains it (issue 32 item 5:
// found by comparison, not by a list of the manager's temp names).
type StoreListing struct {
	Dirs    map[string]bool
	Records map[string]bool // ids of the VMs and snapshots listed then
	// Layout: dirs the manager makes on a successful unarmed run of the
	// same verb that no record explains (NewLayout): its own structure,
	// made on first use, not a leftover.
	Layout map[string]bool
}

// NewLayout is the set of dirs new in dirs since before that no record of
// vms and snaps (new since before, or listed) explains.
func NewLayout(before *StoreListing, dirs []string, vms []manager.VM, snaps []manager.Snapshot) map[string]bool {
	newRec, listed := newRecords(before, vms, snaps)
	out := map[string]bool{}
	for _, d := range dirs {
		if !before.Dirs[d] && !explained(d, newRec, listed) {
			out[d] = true
		}
	}
	return out
}

// newRecords: the ids and names of records new since before, and the ids
// of every record listed now.
func newRecords(before *StoreListing, vms []manager.VM, snaps []manager.Snapshot) (newRec, listed map[string]bool) {
	newRec, listed = map[string]bool{}, map[string]bool{}
	for _, v := range vms {
		listed[v.ID] = true
		if !before.Records[v.ID] {
			newRec[v.ID], newRec[v.Name] = true, true
		}
	}
	for _, s := range snaps {
		listed[s.ID] = true
		if !before.Records[s.ID] {
			newRec[s.ID], newRec[s.Name] = true, true
		}
	}
	return newRec, listed
}

// NewStoreListing is the baseline of dirs with the records listed with it.
func NewStoreListing(dirs []string, vms []manager.VM, snaps []manager.Snapshot) *StoreListing {
	l := &StoreListing{Dirs: map[string]bool{}, Records: map[string]bool{}}
	for _, d := range dirs {
		l.Dirs[d] = true
	}
	for _, v := range vms {
		l.Records[v.ID] = true
	}
	for _, s := range snaps {
		l.Records[s.ID] = true
	}
	return l
}

// ListStoreDirs lists every dir under root, relative to it. A dir that
// vanishes while it is walked (a verb's temp dir being removed) is skipped;
// any other error is returned: a listing with holes proves nothing.
func ListStoreDirs(root string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p != root {
				return nil
			}
			return err
		}
		if !d.IsDir() || p == root {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		out = append(out, rel)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list store %s: %w", root, err)
	}
	return out, nil
}

func (p *Poll) collectStore(in *Input) {
	if in.Store == nil {
		return
	}
	dirs, err := in.Store()
	p.got(SrcStore, err)
	p.StoreDirs = dirs
}

// procs is where the poll finds the case's processes.
func (in *Input) procs() ProcScanner {
	if in.Procs != nil {
		return in.Procs
	}
	return in.Stack
}

// without: the invariant reads a source the manager does not expose.
func (in *Input) without(needs []Source) bool {
	for _, s := range needs {
		if in.Without[s] {
			return true
		}
	}
	return false
}

// needStoreBaseline: asked when the case lists the store; the listing taken
// before the verb is its evidence.
var needStoreBaseline = Evidence{
	Asked: func(in *Input) bool { return in.Store != nil },
	Of: func(in *Input, _ *Poll) []string {
		if in.StoreBefore == nil {
			return []string{"no listing of the store before the verb to compare with"}
		}
		return nil
	}}

func init() {
	State = append(State, StateInvariant{NoLeftoverTempDirs,
		"no dir appeared in the manager's store since before the verb that no record explains (a new record's own dirs, or an existing record's dir made again)",
		[]Source{SrcStore, SrcVMs, SrcSnaps}, needStoreBaseline, checkLeftoverDirs})
}

// checkLeftoverDirs: a dir new since the baseline is explained when one of
// its path elements is the id or name of a record that is new since then
// (its data, its run dir), or when its last element is the id of a record
// listed now (a stopped VM's run dir made again by start). Anything else —
// a capture dir inside an old VM's run dir, a staging dir of a dead build,
// an import temp — is a leftover.
func checkLeftoverDirs(in *Input, p *Poll) []string {
	before := in.StoreBefore
	newRec, listed := newRecords(before, p.VMs, p.Snaps)
	var ev []string
	for _, d := range p.StoreDirs {
		if before.Dirs[d] || before.Layout[d] || explained(d, newRec, listed) {
			continue
		}
		// report the topmost new dir only
		if parent := filepath.Dir(d); parent != "." && !before.Dirs[parent] && !before.Layout[parent] && !explained(parent, newRec, listed) && contains(p.StoreDirs, parent) {
			continue
		}
		ev = append(ev, "<store>/"+d+" is new since before the verb and no record owns it")
	}
	sort.Strings(ev)
	return ev
}

func explained(dir string, newRec, listed map[string]bool) bool {
	elems := strings.Split(dir, string(filepath.Separator))
	for _, e := range elems {
		if newRec[e] {
			return true
		}
	}
	return listed[elems[len(elems)-1]]
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// TagScan finds a manager case's processes: every process whose initial
// environment carries Tag (KEY=VALUE), which the verbs and the VMMs they
// launch inherit. Unlike a best-effort scan it reports what it could not
// read: a process of this uid whose environ fails for any reason but its
// exit fails the scan (issue 32 item 5), so no invariant passes on a scan
// with holes.
type TagScan struct {
	Tag     string
	Harness map[int]bool // processes of the harness's own (the event stream)
}

// ScanProcesses lists the live, non-zombie processes carrying the tag.
func (t TagScan) ScanProcesses() ([]stack.Proc, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("scan /proc: %w", err)
	}
	var out []stack.Proc
	var errs []error
	for _, e := range ents {
		pid, ok := procPID(e.Name())
		if !ok || pid == os.Getpid() {
			continue
		}
		p, mine, err := t.read(pid)
		if err != nil {
			errs = append(errs, err)
		} else if mine {
			out = append(out, p)
		}
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("scan /proc: %w", errors.Join(errs...))
	}
	return out, nil
}

// Identify reads one process of the case.
func (t TagScan) Identify(pid int) (stack.Proc, bool) {
	p, mine, err := t.read(pid)
	return p, err == nil && mine
}

// HarnessPIDs are the harness's own processes among the case's.
func (t TagScan) HarnessPIDs() map[int]bool { return t.Harness }

// read is one process: whether it carries the tag, and an error only when
// it could not be read for another reason than having exited.
func (t TagScan) read(pid int) (stack.Proc, bool, error) {
	dir := "/proc/" + fmt.Sprint(pid)
	env, err := procRead(dir + "/environ")
	if err != nil {
		if gone(err) || otherUID(dir) || olderThanSelf(pid, err) {
			return stack.Proc{}, false, nil
		}
		return stack.Proc{}, false, fmt.Errorf("pid %d environ: %w", pid, err)
	}
	if !hasEntry(env, t.Tag) {
		return stack.Proc{}, false, nil
	}
	st, err := injector.ReadStat(pid)
	if err != nil {
		if gone(err) {
			return stack.Proc{}, false, nil
		}
		return stack.Proc{}, false, fmt.Errorf("pid %d stat: %w", pid, err)
	}
	if st.State == 'Z' {
		return stack.Proc{}, false, nil
	}
	cl, err := procRead(dir + "/cmdline")
	if err != nil {
		if gone(err) {
			return stack.Proc{}, false, nil
		}
		return stack.Proc{}, false, fmt.Errorf("pid %d cmdline: %w", pid, err)
	}
	argv := strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")
	return stack.Proc{PID: pid, PPID: st.PPID, Start: st.Start, Argv: argv}, true, nil
}

// procRead reads a /proc file (a test makes it fail).
var procRead = os.ReadFile

func procPID(name string) (int, bool) {
	pid, err := strconv.Atoi(name)
	return pid, err == nil
}

// gone: the process exited while it was read.
func gone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}

// olderThanSelf: a process this runner may not read (EACCES: pid 1 of a
// container, a non-dumpable daemon) that started before the runner cannot
// carry a tag the runner made.
func olderThanSelf(pid int, err error) bool {
	if !errors.Is(err, fs.ErrPermission) {
		return false
	}
	st, serr := injector.ReadStat(pid)
	self, merr := injector.ReadStat(os.Getpid())
	return serr == nil && merr == nil && st.Start < self.Start
}

// otherUID: the process belongs to another user (its environ is not ours
// to read, and a case's processes are all ours).
func otherUID(dir string) bool {
	fi, err := os.Stat(dir)
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) != os.Getuid()
}

func hasEntry(environ []byte, kv string) bool {
	for _, e := range strings.Split(string(environ), "\x00") {
		if e == kv {
			return true
		}
	}
	return false
}
