package injector

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/internal/ownedtemp"
)

// Census counts what vmchaos runs left on this host: what belongs to no
// live run is a leak. A soak takes one after each pass and wants zeros;
// `vmchaos doctor` prints one.
type Census struct {
	Procs      int   `json:"procs"`       // processes carrying the tag of no live run
	Mounts     int   `json:"mounts"`      // mounts below a leaked run dir
	FuseMounts int   `json:"fuse_mounts"` // of those, FUSE (lazyfs) mounts
	Cgroups    int   `json:"cgroups"`     // vmchaos-* cgroups of no live run
	Netns      int   `json:"netns"`       // /run/netns/vmchaos-* of no live run
	Taps       int   `json:"taps"`        // vmctl TAP devices (vt*) in this net namespace
	FDs        int   `json:"fds"`         // this process's fds on run dirs, pidfds or the registry
	TempDirs   int   `json:"temp_dirs"`   // vmchaos-* entries of the temp dirs of no live run
	TempBytes  int64 `json:"temp_bytes"`  // bytes under those
	// ResultsBytes is what the report dirs hold: information, not a leak.
	ResultsBytes int64    `json:"results_bytes"`
	Detail       []string `json:"detail,omitempty"` // one line per leaked thing
}

// CensusOptions says where to look.
type CensusOptions struct {
	Registry   string   // primary registry ("" = Registry()); indexed ones are read too
	RunID      string   // count only this run's things ("" = every run not alive)
	TempDirs   []string // dirs whose vmchaos-* entries are run dirs ("" = os.TempDir())
	ResultDirs []string // report dirs, counted in ResultsBytes
}

// Leaks is the number of leaked things (bytes not counted: a leaked dir is).
func (c Census) Leaks() int {
	return c.Procs + c.Mounts + c.Cgroups + c.Netns + c.Taps + c.FDs + c.TempDirs
}

// Table is the census as aligned lines.
func (c Census) Table() string {
	var b strings.Builder
	row := func(k string, v any) { fmt.Fprintf(&b, "  %-14s %v\n", k, v) }
	row("processes", c.Procs)
	row("mounts", c.Mounts)
	row("  of them fuse", c.FuseMounts)
	row("cgroups", c.Cgroups)
	row("netns", c.Netns)
	row("tap devices", c.Taps)
	row("harness fds", c.FDs)
	row("temp dirs", c.TempDirs)
	row("temp bytes", c.TempBytes)
	row("results bytes", c.ResultsBytes)
	for _, d := range c.Detail {
		fmt.Fprintf(&b, "  - %s\n", d)
	}
	return b.String()
}

// liveRuns is what runs with a live runner (or one this process cannot
// judge: another pid namespace) own, from every registry's records.
type liveRuns struct {
	byID   map[string]*Record // every record's run, for RunID
	ids    map[string]bool
	paths  []string
	cgroup map[string]bool
	netns  map[string]bool
}

func readLiveRuns(primary string) liveRuns {
	lv := liveRuns{byID: map[string]*Record{}, ids: map[string]bool{}, cgroup: map[string]bool{}, netns: map[string]bool{}}
	ownNS := pidNS(os.Getpid())
	for _, dir := range Registries(primary) {
		files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		for _, f := range files {
			var r Record
			if b, err := os.ReadFile(f); err != nil || json.Unmarshal(b, &r) != nil || r.RunID == "" {
				continue
			}
			lv.byID[r.RunID] = &r
			if r.RunnerPidNS == ownNS && !r.Runner.Alive() {
				continue // dead: what it owned is leaked
			}
			lv.ids[r.RunID] = true
			lv.paths = append(lv.paths, r.Paths...)
			if r.StateDir != "" {
				lv.paths = append(lv.paths, r.StateDir)
			}
			lv.cgroup[r.Cgroup] = true
			for _, n := range r.Netns {
				lv.netns[n] = true
			}
		}
	}
	return lv
}

// owns reports whether p is a live run's dir, above one or below one.
func (lv liveRuns) owns(p string) bool {
	for _, q := range lv.paths {
		if q == p || strings.HasPrefix(q, p+"/") || strings.HasPrefix(p, q+"/") {
			return true
		}
	}
	return false
}

// TakeCensus counts what vmchaos runs left on this host (see Census).
func TakeCensus(o CensusOptions) Census {
	if o.Registry == "" {
		o.Registry = Registry()
	}
	if len(o.TempDirs) == 0 {
		o.TempDirs = []string{os.TempDir()}
	}
	lv := readLiveRuns(o.Registry)
	var c Census
	leaked := censusTemp(&c, o, lv)
	censusProcs(&c, o, lv, leaked)
	censusMounts(&c, leaked)
	censusNamed(&c, o, lv)
	if o.RunID == "" { // fds are this process's, not a run's
		censusFDs(&c, o)
	}
	for _, d := range o.ResultDirs {
		c.ResultsBytes += diskBytes(d)
	}
	return c
}

// runOfEnviron is the run id in a tag's value, or "" for none.
func runOfEnviron(b []byte) string {
	for _, e := range bytes.Split(b, []byte{0}) {
		for _, k := range []string{EnvRunTag + "=", envWatchdog + "=" + EnvRunTag + "="} {
			if v, ok := bytes.CutPrefix(e, []byte(k)); ok {
				return string(v)
			}
		}
	}
	return ""
}

func (o CensusOptions) counts(id string, live bool) bool {
	if o.RunID != "" {
		return id == o.RunID
	}
	return !live
}

// censusProcs counts the processes carrying the tag of no live run (or of
// run RunID), or naming a leaked dir in their command line.
func censusProcs(c *Census, o CensusOptions, lv liveRuns, leaked []string) {
	self := os.Getpid()
	procDir := "/proc"
	ents, _ := os.ReadDir(procDir)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procDir, e.Name(), "environ"))
		if err != nil {
			continue
		}
		if id := runOfEnviron(b); id != "" && o.counts(id, lv.ids[id]) {
			c.Procs++
			c.Detail = append(c.Detail, fmt.Sprintf("process %d of run %s", pid, id))
		} else if namesPath(pid, leaked) {
			c.Procs++
			c.Detail = append(c.Detail, fmt.Sprintf("process %d naming a leaked dir: %s", pid, strings.Join(cmdline(pid), " ")))
		}
	}
}

// censusTemp counts leaked run dirs (the vmchaos-* entries of the temp dirs
// no live run owns, or the dirs of run RunID) and returns them.
func censusTemp(c *Census, o CensusOptions, lv liveRuns) []string {
	var dirs []string
	if o.RunID != "" {
		if r := lv.byID[o.RunID]; r != nil {
			dirs = append(dirs, r.Paths...)
		}
	} else {
		for _, t := range o.TempDirs {
			ents, _ := filepath.Glob(filepath.Join(t, runPathPrefix+"*"))
			dirs = append(dirs, ents...)
		}
	}
	var out []string
	for _, d := range dirs {
		if _, err := os.Lstat(d); err != nil || d == defaultRegistry || (o.RunID == "" && (lv.owns(d) || ownedtemp.Of(d) == ownedtemp.Live)) {
			continue
		}
		n := diskBytes(d)
		c.TempDirs++
		c.TempBytes += n
		c.Detail = append(c.Detail, fmt.Sprintf("dir %s (%d bytes)", d, n))
		out = append(out, d)
	}
	return out
}

// diskBytes is the apparent size of everything under p (symlinks not followed).
func diskBytes(p string) int64 {
	var n int64
	_ = filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil && info.Mode().IsRegular() {
			n += info.Size()
		}
		return nil
	})
	return n
}

// censusMounts counts the mounts at or below the leaked dirs.
func censusMounts(c *Census, leaked []string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		c.Detail = append(c.Detail, "mounts: "+err.Error())
		return
	}
	for _, ln := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(ln, " - ")
		f := strings.Fields(pre)
		if !ok || len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		for _, d := range leaked {
			if mp != d && !strings.HasPrefix(mp, d+"/") {
				continue
			}
			c.Mounts++
			fstype := firstOr(strings.Fields(post), "?")
			if strings.HasPrefix(fstype, "fuse") {
				c.FuseMounts++
			}
			c.Detail = append(c.Detail, fmt.Sprintf("mount %s (%s)", mp, fstype))
			break
		}
	}
}

// censusNamed counts cgroups, network namespaces and TAP devices.
func censusNamed(c *Census, o CensusOptions, lv liveRuns) {
	var cgs, nss []string
	if r := lv.byID[o.RunID]; o.RunID != "" && r != nil {
		if r.Cgroup != "" {
			cgs = append(cgs, r.Cgroup)
		}
		for _, n := range r.Netns {
			nss = append(nss, filepath.Join(netnsDir, n))
		}
	} else if o.RunID == "" {
		if root := cgroup2Mount(); root != "" {
			cgs, _ = filepath.Glob(filepath.Join(root, runPathPrefix+"*"))
		}
		nss, _ = filepath.Glob(filepath.Join(netnsDir, runPathPrefix+"*"))
	}
	for _, cg := range cgs {
		if _, err := os.Stat(cg); err == nil && (o.RunID != "" || !lv.cgroup[cg]) {
			c.Cgroups++
			c.Detail = append(c.Detail, "cgroup "+cg)
		}
	}
	for _, ns := range nss {
		if _, err := os.Lstat(ns); err == nil && (o.RunID != "" || !lv.netns[filepath.Base(ns)]) {
			c.Netns++
			c.Detail = append(c.Detail, "netns "+ns)
		}
	}
	taps, _ := filepath.Glob("/sys/class/net/vt*/tun_flags")
	sort.Strings(taps)
	for _, t := range taps {
		c.Taps++
		c.Detail = append(c.Detail, "tap "+filepath.Base(filepath.Dir(t)))
	}
}

// censusFDs counts this process's fds that a finished run should have
// closed: pidfds, and files below a run dir or the registries.
func censusFDs(c *Census, o CensusOptions) {
	ents, _ := os.ReadDir("/proc/self/fd")
	regs := Registries(o.Registry)
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil && n <= 2 {
			// stdio is the caller's: `doctor --census --json > RESULTS/census.json`
			// (make soak) is not a leaked fd
			continue
		}
		t, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			continue // the fd ReadDir itself used, now closed
		}
		leak := t == "anon_inode:[pidfd]" || strings.Contains(t, "/"+runPathPrefix)
		for _, r := range regs {
			leak = leak || strings.HasPrefix(t, r+"/")
		}
		if leak {
			c.FDs++
			c.Detail = append(c.Detail, fmt.Sprintf("fd %s → %s", e.Name(), t))
		}
	}
}

// CleanOrphanCgroups removes the vmchaos-* cgroups that no run record of
// any registry names (live or leftover, so CleanLeftovers could not reach
// them) and that hold no process: a sandbox cgroup whose run removed its
// record while the cgroup was still busy. The census counts them; without
// this, `doctor --clean` left them for ever. One that holds a process, or
// is younger than orphanMinAge, is left alone: it may be a live run's
// whose registry this doctor does not see (a test's private registry), or
// one a run just made and has not put its init in yet.
func CleanOrphanCgroups(ctx context.Context, primary string) ([]string, error) {
	return cleanOrphanCgroups(ctx, cgroup2Mount(), primary, orphanMinAge)
}

// orphanMinAge: a run's sandbox puts its init in its cgroup within a
// second of making it.
const orphanMinAge = time.Minute

func cleanOrphanCgroups(ctx context.Context, root, primary string, minAge time.Duration) ([]string, error) {
	if root == "" {
		return nil, nil
	}
	named := map[string]bool{}
	for _, r := range readLiveRuns(primary).byID { // every record, live or not
		named[r.Cgroup] = true
	}
	cgs, _ := filepath.Glob(filepath.Join(root, runPathPrefix+"*"))
	var removed []string
	var errs []error
	for _, cg := range cgs {
		if named[cg] {
			continue
		}
		if st, err := os.Stat(cg); err != nil || time.Since(st.ModTime()) < minAge || len(cgroupProcs(cg)) > 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		err := removeCgroupTree(ctx, cg)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("orphan cgroup %s: %w", cg, err))
			continue
		}
		removed = append(removed, cg)
	}
	return removed, errors.Join(errs...)
}
