package vmctl

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// VMM cgroup modes (--vmm-cgroup, VMCTL_VMM_CGROUP).
const (
	// CgroupAuto puts each VMM in its own cgroup where cgroup v2 is
	// writable and says on stderr why not where it is not.
	CgroupAuto = "auto"
	// CgroupOn requires it: a launch fails with a clear error where cgroup
	// v2 is not writable.
	CgroupOn = "on"
	// CgroupOff launches VMMs in the caller's cgroup.
	CgroupOff = "off"
)

// unitTagEnv is the builtin supervisor's stand-in for a unit's cgroup
// (injector.EnvUnitTag: a process carrying it counts as the unit's). A VMM
// that leaves the caller's cgroup leaves the unit, so it does not carry it.
const unitTagEnv = "VMCHAOS_INJECTOR_UNIT"

// vmmCgroup is one VM's cgroup, opened for CLONE_INTO_CGROUP.
type vmmCgroup struct {
	dir string
	fd  int
}

func (c *vmmCgroup) close() {
	if c != nil && c.fd >= 0 {
		unix.Close(c.fd)
		c.fd = -1
	}
}

// cgroup2Root returns this process's view of the unified hierarchy's mount
// (/sys/fs/cgroup, /sys/fs/cgroup/unified on a hybrid host; inside a cgroup
// namespace, its root).
func cgroup2Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	var root string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		_, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 {
			root = fields[4] // the last mount wins (a rebind over an older one)
		}
	}
	if root == "" {
		return "", errors.New("no cgroup2 mount")
	}
	return root, nil
}

// cgroupParent is the dir holding this store's per-VM cgroups:
// <cgroup2>/vmctl-<hash of the root dir>, so stores sharing a host never
// collect each other's.
func (m *Manager) cgroupParent() (string, error) {
	root, err := cgroup2Root()
	if err != nil {
		return "", err
	}
	h := sha256.Sum256([]byte(m.cfg.RootDir))
	return filepath.Join(root, "vmctl-"+hex.EncodeToString(h[:4])), nil
}

// vmCgroupDir is VM id's cgroup, "" when the mode is off or there is no
// cgroup2 mount.
func (m *Manager) vmCgroupDir(id string) string {
	if m.cfg.VMMCgroup == CgroupOff {
		return ""
	}
	p, err := m.cgroupParent()
	if err != nil {
		return ""
	}
	return filepath.Join(p, id)
}

// openVMMCgroup creates (or reuses) VM id's cgroup and opens it for the
// launch. nil with no error: the mode is off, or auto on a host where cgroup
// v2 is not writable (said on stderr).
func (m *Manager) openVMMCgroup(id string) (*vmmCgroup, error) {
	if m.cfg.VMMCgroup == CgroupOff {
		return nil, nil
	}
	cg, err := m.makeVMMCgroup(id)
	if err == nil {
		return cg, nil
	}
	err = fmt.Errorf("vmm cgroup: %w: cgroup v2 is not writable here (need root and a cgroup2 mount; --vmm-cgroup off launches VMMs in the caller's cgroup, where stopping the caller's unit kills them)", err)
	if m.cfg.VMMCgroup == CgroupOn {
		return nil, err
	}
	m.logf("%v; launching in the caller's cgroup", err)
	return nil, nil
}

func (m *Manager) makeVMMCgroup(id string) (*vmmCgroup, error) {
	parent, err := m.cgroupParent()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(parent, id)
	err = os.MkdirAll(dir, 0o755)
	if errors.Is(err, os.ErrNotExist) {
		err = os.MkdirAll(dir, 0o755) // a gc removed the empty parent in between
	}
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	return &vmmCgroup{dir: dir, fd: fd}, nil
}

// vmmSysProcAttr is how a VMM is started: its own session, and born inside
// its own cgroup (CLONE_INTO_CGROUP), so stopping or killing the caller's
// systemd unit (KillMode=control-group, systemctl kill --kill-who=all) does
// not reach it.
func vmmSysProcAttr(cg *vmmCgroup) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setsid: true}
	if cg != nil {
		a.UseCgroupFD, a.CgroupFD = true, cg.fd
	}
	return a
}

// vmmEnv is the VMM's environment: ours, minus the supervisor's unit tag
// when it has its own cgroup.
func vmmEnv(cg *vmmCgroup) []string {
	env := os.Environ()
	if cg == nil {
		return env
	}
	out := env[:0:0]
	for _, e := range env {
		if !strings.HasPrefix(e, unitTagEnv+"=") {
			out = append(out, e)
		}
	}
	return out
}

// removeVMMCgroup removes VM id's cgroup once its VMM is gone (rm). A cgroup
// still populated answers EBUSY for a moment after its last task was killed,
// so that is retried briefly.
func (m *Manager) removeVMMCgroup(id string) error {
	dir := m.vmCgroupDir(id)
	if dir == "" {
		return nil
	}
	for i := 0; ; i++ {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			// The store's parent goes with its last VM (a launch racing
			// this recreates it: makeVMMCgroup retries its mkdir).
			_ = unix.Rmdir(filepath.Dir(dir))
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || i >= 100 {
			return fmt.Errorf("remove vmm cgroup %s: %w", dir, err)
		}
		_ = sleepRaw(context.Background(), 10*time.Millisecond)
	}
}

// gcCgroups removes the per-VM cgroups of ids no record or tombstone names
// (a cgroup with a live process refuses rmdir and stays), then the store's
// parent if that left it empty.
func (m *Manager) gcCgroups(known func(id string) bool) []string {
	if m.cfg.VMMCgroup == CgroupOff {
		return nil
	}
	parent, err := m.cgroupParent()
	if err != nil {
		return nil
	}
	ents, _ := os.ReadDir(parent)
	var out []string
	for _, e := range ents {
		if !e.IsDir() || !validID(e.Name()) || known(e.Name()) {
			continue
		}
		if unix.Rmdir(filepath.Join(parent, e.Name())) == nil {
			out = append(out, e.Name())
		}
	}
	_ = unix.Rmdir(parent)
	return out
}
