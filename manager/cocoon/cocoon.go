// Package cocoon is the manager adapter of a user's cocoon binary
// (docs/architecture.md §14): it runs the binary the user points at (--manager-bin)
// on a per-case root, run and log dir, and reads it only as a user can: its
// `--format json` / `-o json` outputs, its documented dir layout, the command
// lines of the VMMs it launches. The harness never builds, fetches or ships
// cocoon.
package cocoon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmchaos/vmchaos/manager"
)

// VMMName is the basename cocoon checks before it signals a VMM
// (config ch_binary, default "cloud-hypervisor" on PATH).
const VMMName = "cloud-hypervisor"

// ImageName is the name the case's guest image is imported under.
const ImageName = "vmchaos-guest"

// chDir is the sub-dir cocoon keeps per backend under its run and log dirs
// (hypervisor/baseconfig.go: RunDir()/LogDir() join the backend name,
// "cloudhypervisor").
const chDir = "cloudhypervisor"

// Exec runs the cocoon binary with args and returns stdout; a non-zero exit
// is an error carrying stderr.
type Exec func(ctx context.Context, args ...string) ([]byte, error)

// Adapter drives one case's cocoon store.
type Adapter struct {
	opts   manager.Options
	root   string
	runDir string
	logDir string
	exec   Exec
	// help reads one help page; tests replace it with recorded pages.
	help HelpFunc
	// version runs `cocoon version`; tests replace it.
	version func(context.Context) (string, error)
	cliOnce sync.Once
	cli     *CLI
	// net is the case's own net holder (Options.NetPool): every verb
	// then runs inside its namespaces (net.go)
	net *caseNet
}

var (
	_ manager.Embedder           = (*Adapter)(nil)
	_ manager.CapabilityReporter = (*Adapter)(nil)
)

// New returns the adapter of the store under o.Dir; Setup creates it.
func New(o manager.Options) *Adapter {
	a := &Adapter{opts: o, root: filepath.Join(o.Dir, "root"), runDir: filepath.Join(o.Dir, "run"),
		logDir: filepath.Join(o.Dir, "log")}
	if o.OneFS {
		a.runDir = filepath.Join(a.root, "run") // cocoon's default layout (cmd/root.go)
	}
	a.exec = a.run
	a.help = a.runHelp
	a.version = func(ctx context.Context) (string, error) {
		b, err := a.exec(ctx, "version")
		return string(b), err
	}
	return a
}

// CLI is the binary's CLI, probed on first use and shared by every adapter
// of the same binary (one probe per run, not one per case).
func (a *Adapter) CLI(ctx context.Context) *CLI {
	a.cliOnce.Do(func() {
		key, cacheable := probeKey(a.opts)
		if cacheable {
			if c, ok := probeCache.Load(key); ok {
				a.cli = c.(*CLI)
				return
			}
		}
		a.cli = Probe(ctx, a.opts.Bin, a.help, a.version)
		if cacheable && a.cli.Err() == nil {
			probeCache.Store(key, a.cli)
		}
	})
	return a.cli
}

// Capabilities is the capability table of the binary (manager.CapabilityReporter);
// an error only when its CLI could not be read at all.
func (a *Adapter) Capabilities(ctx context.Context) (manager.Capabilities, error) {
	cli := a.CLI(ctx)
	if err := cli.Err(); err != nil {
		return cli.Caps, fmt.Errorf("cocoon %s: %w", a.opts.Bin, err)
	}
	caps := cli.Caps
	caps.Items = append([]manager.Capability(nil), caps.Items...)
	// A present verb's form is the very argv Command gives it here, so the
	// table shows what a case will run.
	for i, it := range caps.Items {
		argv, err := a.Command(manager.Call{Verb: manager.Verb(it.Name), VM: "VM", Snapshot: "SNAP", Name: "NAME", File: "FILE"})
		switch {
		case it.Present && err == nil:
			caps.Items[i].How = shown(argv)
		case it.Name == manager.FeatureEvents && it.Present:
			caps.Items[i].How = shown(a.EventCommand())
		}
	}
	return caps, nil
}

// shown is argv as a table prints it: the binary by its base name.
func shown(argv []string) string {
	return strings.Join(append([]string{filepath.Base(argv[0])}, argv[1:]...), " ")
}

// probeCache holds one CLI per binary file (path, config, size, mtime): a
// binary rebuilt in place is probed again.
var probeCache sync.Map

func probeKey(o manager.Options) (string, bool) {
	st, err := os.Stat(o.Bin)
	if err != nil {
		return "", false
	}
	return fmt.Sprintf("%s\x00%s\x00%d\x00%d", o.Bin, o.Config, st.Size(), st.ModTime().UnixNano()), true
}

// runHelp is `cocoon PATH --help`; cobra prints help without reading the
// config, so it runs before Setup.
func (a *Adapter) runHelp(ctx context.Context, path string) (string, error) {
	b, err := a.exec(ctx, append(strings.Fields(path), "--help")...)
	return string(b), err
}

// Name is "cocoon".
func (a *Adapter) Name() string { return "cocoon" }

// Env is the environment of every cocoon the adapter runs: its three dirs
// through cocoon's own COCOON_* variables, fakech first on PATH as
// `cloud-hypervisor`, and short stop/socket timeouts that fit a fake guest.
func (a *Adapter) Env() []string {
	env := []string{
		"PATH=" + a.opts.VMMDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + a.opts.Dir,
		"COCOON_ROOT_DIR=" + a.root,
		"COCOON_RUN_DIR=" + a.runDir,
		"COCOON_LOG_DIR=" + a.logDir,
		"COCOON_CNI_CONF_DIR=" + filepath.Join(a.opts.Dir, "cni", "net.d"),
		"COCOON_CNI_BIN_DIR=" + filepath.Join(a.opts.Dir, "cni", "bin"),
		"COCOON_STOP_TIMEOUT_SECONDS=10",
	}
	return append(env, a.opts.Env...)
}

// Setup creates the dirs, the firmware fixture cocoon looks for at
// <root>/firmware/CLOUDHV.fd (fakech checks only that it exists), and
// imports the fake guest as a qcow2 cloud image (`image import`).
func (a *Adapter) Setup(ctx context.Context) error {
	if err := a.checkSocketPaths(); err != nil {
		return err
	}
	for _, d := range []string{a.root, a.runDir, a.logDir, filepath.Join(a.root, "firmware"),
		filepath.Join(a.opts.Dir, "cni", "net.d"), filepath.Join(a.opts.Dir, "cni", "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cocoon adapter: %w", err)
		}
	}
	if a.opts.NetPool != "" {
		// a guest the harness reaches: its NIC from the real CNI plugins,
		// every verb inside the case's own namespaces
		if err := a.setupNet(ctx); err != nil {
			return fmt.Errorf("cocoon adapter: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(a.root, "firmware", "CLOUDHV.fd"), []byte("fake firmware\n"), 0o644); err != nil {
		return fmt.Errorf("cocoon adapter: firmware fixture: %w", err)
	}
	qcow := filepath.Join(a.opts.Dir, "guest.qcow2")
	if out, err := exec.CommandContext(ctx, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", a.opts.Image, qcow).CombinedOutput(); err != nil {
		return fmt.Errorf("cocoon adapter: qemu-img convert %s: %w: %s", a.opts.Image, err, strings.TrimSpace(string(out)))
	}
	if _, err := a.exec(ctx, "image", "import", ImageName, qcow); err != nil {
		return fmt.Errorf("cocoon adapter: image import: %w", err)
	}
	return os.Remove(qcow)
}

// vmIDLen is the length of a cocoon VM id (26 base32 characters).
const vmIDLen = 26

// maxSocketPath is the longest path a unix socket can bind: sun_path is 108
// bytes with its NUL.
const maxSocketPath = 107

// checkSocketPaths refuses a run dir under which the sockets of cocoon's
// VMMs (<run>/cloudhypervisor/<id>/console.sock, the longest) cannot be
// bound: cloud-hypervisor then fails "Error creation API server's socket:
// Invalid argument" and cocoon only says "launch VM: timeout after 5s",
// which reads like load. The reason names the path and what to shorten.
func (a *Adapter) checkSocketPaths() error {
	p := filepath.Join(a.vmRunDir(strings.Repeat("X", vmIDLen)), "console.sock")
	if len(p) > maxSocketPath {
		return fmt.Errorf("cocoon adapter: a VMM socket under %s would be %d bytes (%s), over the %d a unix socket path can have: use a shorter TMPDIR",
			a.runDir, len(p), p, maxSocketPath)
	}
	return nil
}

// ImageRef is the imported image's name.
func (a *Adapter) ImageRef() string { return ImageName }

// Command maps a verb to the command line of the cocoon in front of the
// adapter, as its own help pages describe it (CLI): a verb or flag the build
// lacks makes the verb ErrNotSupported with the exact reason, and a JSON
// output flag is passed only where the build has one (a v0.2.x `vm run`
// has no -o; the harness reads a verb's result from the lists, not from its
// stdout). cocoon has no verb for a stale `creating` record: its gc
// collects one after a grace period.
func (a *Adapter) Command(c manager.Call) ([]string, error) {
	cli := a.CLI(context.Background())
	if err := cli.Err(); err != nil {
		return nil, fmt.Errorf("cocoon %s: %w", c.Verb, err)
	}
	it, ok := cli.Caps.Get(capabilityOf(c.Verb))
	if !ok {
		return nil, fmt.Errorf("cocoon: %s: %w", c.Verb, manager.ErrNotSupported)
	}
	if !it.Present {
		return nil, fmt.Errorf("cocoon: %s: %w", it.Reason, manager.ErrNotSupported)
	}
	var args []string
	switch c.Verb {
	case manager.VerbCreate:
		nics := 0 // the catalogue's fixtures: no NIC unless the call asks
		if c.NICs != nil {
			nics = *c.NICs
		}
		args = append(a.withJSON(cli, "vm run", "--name", c.Name, "--nics", strconv.Itoa(nics), "--cpu", "1", "--memory", "512M"), a.ImageRef())
	case manager.VerbClone:
		flags := []string{"--name", c.Name}
		if c.NICs != nil {
			flags = append(flags, "--nics", strconv.Itoa(*c.NICs))
		}
		args = append(a.withJSON(cli, "vm clone", flags...), c.Snapshot)
	case manager.VerbSnapshotSave:
		args = []string{"snapshot", "save", "--name", c.Name, c.VM}
	case manager.VerbSnapshotRm:
		args = []string{"snapshot", "rm", c.Snapshot}
	case manager.VerbRestore:
		args = append(a.withJSON(cli, "vm restore"), c.VM, c.Snapshot)
	case manager.VerbStart:
		args = []string{"vm", "start", c.VM}
	case manager.VerbStop:
		args = []string{"vm", "stop", c.VM}
	case manager.VerbRm:
		args = []string{"vm", "rm", "--force", c.VM}
	case manager.VerbGC:
		args = []string{"gc"}
	case manager.VerbInspect:
		args = []string{"vm", "inspect", c.VM}
	case manager.VerbList:
		args = []string{"vm", "list", a.jsonFlag("vm list"), "json"}
	case manager.VerbSnapshotList:
		args = []string{"snapshot", "list", a.jsonFlag("snapshot list"), "json"}
	case manager.VerbExport:
		args = []string{"snapshot", "export", c.Snapshot, "--output", c.File}
	case manager.VerbImport:
		args = []string{"snapshot", "import", "--name", c.Name, c.File}
	case manager.VerbEvents:
		args = []string{"vm", "status", "--event", a.jsonFlag("vm status"), "json", "--interval", wholeSeconds(c.Interval)}
	default:
		return nil, fmt.Errorf("cocoon: %s: %w", c.Verb, manager.ErrNotSupported)
	}
	return append(a.argv0(), args...), nil
}

// capabilityOf is the table row that says whether the build has verb: the
// lists and the event stream are features, every other verb its own row.
func capabilityOf(v manager.Verb) string {
	switch v {
	case manager.VerbList, manager.VerbSnapshotList:
		return manager.FeatureListJSON
	case manager.VerbEvents:
		return manager.FeatureEvents
	}
	return string(v)
}

// wholeSeconds is an interval in cocoon's form: `vm status --interval` is an
// int, so a fraction rounds up and nothing goes below 1.
func wholeSeconds(s string) string {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 1 {
		return "1"
	}
	return strconv.Itoa(int(math.Ceil(f)))
}

// withJSON is path's words and flags, with its JSON output flag when the
// build has one.
func (a *Adapter) withJSON(cli *CLI, path string, flags ...string) []string {
	args := append(strings.Fields(path), flags...)
	if f, ok := cli.JSONFlag(path); ok {
		args = append(args, f, "json")
	}
	return args
}

// jsonFlag is path's JSON output flag, or the one every cocoon release so
// far has for it (the capability table already names its absence).
func (a *Adapter) jsonFlag(path string) string {
	if f, ok := a.CLI(context.Background()).JSONFlag(path); ok {
		return f
	}
	return "--format"
}

// argv0 is the binary with the user's config file, if any: the wrapper
// into the case's namespaces once the adapter's networking is up.
func (a *Adapter) argv0() []string {
	bin := a.opts.Bin
	if a.net != nil {
		bin = a.net.wrapper
	}
	if a.opts.Config != "" {
		return []string{bin, "--config", a.opts.Config}
	}
	return []string{bin}
}

// EventCommand is `vm status --event --format json --interval 1` (whole seconds:
// cocoon's interval is an int; it also wakes on fsnotify of its index).
func (a *Adapter) EventCommand() []string {
	return append(a.argv0(), "vm", "status", "--event", a.jsonFlag("vm status"), "json", "--interval", "1")
}

// vmWire is the part of cocoon's types.VM the adapter reads (the same
// shape on v0.2.7, v0.3.0 and HEAD: types/vm.go, types/network.go).
type vmWire struct {
	ID     string `json:"id"`
	State  string `json:"state"`
	PID    int    `json:"pid"`
	Config struct {
		Name string `json:"name"`
	} `json:"config"`
	NetworkConfigs []*struct {
		NetnsPath string `json:"netns_path"`
		Network   *struct {
			IP string `json:"ip"`
		} `json:"network"`
	} `json:"network_configs"`
}

// GuestSSHPort is where a guest's sshd listens (a cloud image's default; the
// fake guest image the harness imports keeps it).
const GuestSSHPort = "22"

// guest is the first NIC's guest address (ip:22) and the netns it lives in,
// from the address CNI's IPAM gave it (cocoon hands the same one to the
// guest in its cloud-init network-config); "" without a NIC or an address.
func (w vmWire) guest() (addr, netns string) {
	if len(w.NetworkConfigs) == 0 || w.NetworkConfigs[0] == nil {
		return "", ""
	}
	nc := w.NetworkConfigs[0]
	if nc.Network != nil && nc.Network.IP != "" {
		addr = net.JoinHostPort(nc.Network.IP, GuestSSHPort)
	}
	return addr, nc.NetnsPath
}

// ParseEvent decodes {"event":"ADDED|MODIFIED|DELETED","vm":{types.VM}};
// cocoon reports a running record with a dead VMM as "stopped (stale)".
func (a *Adapter) ParseEvent(line []byte) (manager.Event, error) {
	return ParseEvent(line)
}

// ParseEvent is Adapter.ParseEvent without an adapter (tests, recorded
// outputs). A log line of a release that logs to stdout (v0.2.x) is an
// error like any other non-event: the stream reader must not read it as
// one.
func ParseEvent(line []byte) (manager.Event, error) {
	var w struct {
		Event string  `json:"event"`
		VM    *vmWire `json:"vm"`
	}
	if err := json.Unmarshal(line, &w); err != nil {
		return manager.Event{}, fmt.Errorf("cocoon event: %w (%.200q)", err, line)
	}
	if w.Event == "" || w.VM == nil || w.VM.ID == "" {
		return manager.Event{}, fmt.Errorf("cocoon event: no event or vm id in %.200q", line)
	}
	return manager.Event{Type: w.Event, ID: w.VM.ID, Name: w.VM.Config.Name, State: w.VM.State}, nil
}

// noVMs and noSnapshots are what cocoon prints instead of JSON for an empty
// list, even with --format json.
const (
	noVMs       = "No VMs found."
	noSnapshots = "No snapshots found."
)

// VMs is `vm list --format json`: the records as stored (a running record
// keeps "running" after its VMM died; the checker judges liveness itself).
func (a *Adapter) VMs(ctx context.Context) ([]manager.VM, error) {
	b, err := a.exec(ctx, "vm", "list", a.jsonFlag("vm list"), "json")
	if err != nil {
		return nil, fmt.Errorf("cocoon vm list: %w", err)
	}
	return ParseVMs(b)
}

// ParseVMs decodes `vm list --format json`.
func ParseVMs(b []byte) ([]manager.VM, error) {
	b = StripLogLines(b)
	if strings.TrimSpace(string(b)) == noVMs {
		return []manager.VM{}, nil
	}
	var ws []vmWire
	if err := manager.DecodeJSON(b, &ws, "cocoon vm list"); err != nil {
		return nil, err
	}
	out := make([]manager.VM, 0, len(ws))
	for _, w := range ws {
		if w.ID == "" {
			return nil, fmt.Errorf("cocoon vm list: a record without an id (%+v)", w)
		}
		addr, netns := w.guest()
		out = append(out, manager.VM{ID: w.ID, Name: w.Config.Name, State: w.State, PID: w.PID, Address: addr, Netns: netns})
	}
	return out, nil
}

// Snapshots is `snapshot list --format json`. cocoon lists only finished
// snapshots (it records one after the data is in place), so every listed
// snapshot is ready.
func (a *Adapter) Snapshots(ctx context.Context) ([]manager.Snapshot, error) {
	b, err := a.exec(ctx, "snapshot", "list", a.jsonFlag("snapshot list"), "json")
	if err != nil {
		return nil, fmt.Errorf("cocoon snapshot list: %w", err)
	}
	ss, err := ParseSnapshots(b)
	for i := range ss {
		ss[i].Dir = a.SnapshotDir(ss[i].ID)
	}
	return ss, err
}

// SnapshotDir is where cocoon keeps a snapshot's data as the VMM wrote it
// (config.json, state.json, memory-ranges beside its own cocoon.json):
// <root>/snapshot/localfile/<ID> on every build (snapshot/localfile/config.go
// SnapshotDataDir).
func (a *Adapter) SnapshotDir(id string) string {
	return filepath.Join(a.root, "snapshot", "localfile", id)
}

// ParseSnapshots decodes `snapshot list --format json`.
func ParseSnapshots(b []byte) ([]manager.Snapshot, error) {
	b = StripLogLines(b)
	if strings.TrimSpace(string(b)) == noSnapshots {
		return []manager.Snapshot{}, nil
	}
	var ws []struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	}
	if err := manager.DecodeJSON(b, &ws, "cocoon snapshot list"); err != nil {
		return nil, err
	}
	out := make([]manager.Snapshot, 0, len(ws))
	for _, w := range ws {
		if w.ID == "" {
			return nil, fmt.Errorf("cocoon snapshot list: a record without an id (%+v)", w)
		}
		out = append(out, manager.Snapshot{ID: w.ID, Name: w.Name, State: manager.SnapReady})
	}
	return out, nil
}

// Check: cocoon has no consistency-check verb.
func (a *Adapter) Check(context.Context) (manager.CheckReport, error) {
	return manager.CheckReport{}, fmt.Errorf("cocoon check: %w", manager.ErrNotSupported)
}

// OpsLockPath: cocoon locks its whole index (db/vms.lock), not one VM, so
// no per-VM holder can be observed.
func (a *Adapter) OpsLockPath(string) string { return "" }

// LeasePath: cocoon has no per-snapshot lease.
func (a *Adapter) LeasePath(string) string { return "" }

// vmRunDir is <run>/cloudhypervisor/<ID>.
func (a *Adapter) vmRunDir(id string) string { return filepath.Join(a.runDir, chDir, id) }

// APISocket is <run>/cloudhypervisor/<ID>/api.sock.
func (a *Adapter) APISocket(vmID string) string { return filepath.Join(a.vmRunDir(vmID), "api.sock") }

// APISockets lists <run>/cloudhypervisor/*/api.sock.
func (a *Adapter) APISockets() (map[string]string, error) {
	ents, err := os.ReadDir(filepath.Join(a.runDir, chDir))
	if os.IsNotExist(err) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cocoon run dir: %w", err)
	}
	out := map[string]string{}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		p := a.APISocket(e.Name())
		if _, err := os.Lstat(p); err == nil {
			out[e.Name()] = p
		} else if !os.IsNotExist(err) {
			return nil, fmt.Errorf("cocoon run dir: %w", err)
		}
	}
	return out, nil
}

// VMMOf: a VMM of this store has argv[0] basename cloud-hypervisor and an
// argument <run>/cloudhypervisor/<ID>/api.sock (cocoon's own rule,
// utils.VerifyProcessCmdline with the socket path).
func (a *Adapter) VMMOf(argv []string) (string, bool) {
	if len(argv) == 0 || filepath.Base(argv[0]) != VMMName {
		return "", false
	}
	prefix := filepath.Join(a.runDir, chDir) + "/"
	for _, arg := range argv[1:] {
		i := strings.Index(arg, prefix)
		if i < 0 {
			continue
		}
		if id, rest, ok := strings.Cut(arg[i+len(prefix):], "/"); ok && id != "" && strings.HasPrefix(rest, "api.sock") {
			return id, true
		}
	}
	return "", false
}

// TempDirs are cocoon's temporary names left in the store: a snapshot
// capture dir (<run>/cloudhypervisor/<ID>/snapshot-*), a clone staging dir
// (<run>/cloudhypervisor/<ID>.restore-staging), image import temps
// (import-*, pull-*) and atomic-write temps (.tmp-*). Called when no verb
// runs, so every one found is a leftover.
func (a *Adapter) TempDirs(context.Context) ([]string, error) {
	var out []string
	tops := []string{a.root}
	if !strings.HasPrefix(a.runDir, a.root+"/") {
		tops = append(tops, a.runDir)
	}
	for _, top := range tops {
		err := filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				if os.IsNotExist(err) {
					return nil
				}
				return err
			}
			if IsTempName(p, d.IsDir()) {
				out = append(out, p)
				if d.IsDir() {
					return filepath.SkipDir
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("cocoon temp dirs: %w", err)
		}
	}
	return out, nil
}

// IsTempName reports whether p is one of cocoon's temporary names.
func IsTempName(p string, dir bool) bool {
	base := filepath.Base(p)
	parent := filepath.Base(filepath.Dir(filepath.Dir(p)))
	switch {
	case dir && strings.HasPrefix(base, "snapshot-") && parent == chDir:
		return true
	case dir && strings.HasSuffix(base, ".restore-staging"):
		return true
	case strings.HasPrefix(base, ".tmp-"), strings.HasPrefix(base, "import-"), strings.HasPrefix(base, "pull-"):
		return true
	}
	return false
}

// run runs cocoon with the adapter's environment.
func (a *Adapter) run(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	argv := append(a.argv0(), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = a.Env()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return out.Bytes(), fmt.Errorf("exit %d: %s", ee.ExitCode(), lastLines(errb.String(), 3))
		}
		return out.Bytes(), err
	}
	return out.Bytes(), nil
}

// lastLines keeps the end of a verbose log (cocoon logs every step to
// stderr; the error is at the end).
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// logLine is one line of cocoon's console log (zerolog's ConsoleWriter,
// coloured or not): "03 Dec 26 14:32 UTC INF message func=...". Releases
// before v0.3.7 log to stdout (their cmd/root.go hands log.SetupLog the
// process's stdout; ce14c76 made it swap in stderr for the call), so a list's JSON may
// come after such lines.
var logLine = regexp.MustCompile(`^(?:\x1b\[[0-9;]*m)?\d{2} [A-Z][a-z]{2} \d{2} \d{2}:\d{2} [A-Z]+(?:\x1b\[[0-9;]*m)? (?:\x1b\[[0-9;]*m)?(?:DBG|INF|WRN|ERR|FTL|PNC|TRC)\b`)

// StripLogLines drops cocoon's own log lines from a verb's stdout and keeps
// everything else, so a list that is not JSON still fails to decode.
func StripLogLines(b []byte) []byte {
	var out [][]byte
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		if !logLine.Match(line) {
			out = append(out, line)
		}
	}
	return bytes.Join(out, nil)
}

var _ manager.StoreLayout = (*Adapter)(nil)

// StoreDirs: cocoon's root (its databases, images, the VMs' disks,
// snapshots) and its log dir are durable. Its run dir is not emptied: its
// default, /var/lib/cocoon/run (cmd/root.go), is on the node's disk inside
// the root, so a reboot keeps what was durable there and cocoon's boot
// meets the dead VMMs' pid files; with Options.OneFS it is inside the root
// and so on the root's lazy mount (clone hard-links a snapshot's memory
// file into it: on another filesystem cocoon before v0.3.x fails EXDEV).
func (a *Adapter) StoreDirs() (durable, volatile []string) {
	return []string{a.root, a.logDir}, nil
}
