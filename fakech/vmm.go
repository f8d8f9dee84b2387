package fakech

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/fakech/qcow2"
	"github.com/vmchaos/vmchaos/timescale"
)

// Compat selects the CH release whose version-dependent behaviour fakech
// reproduces.
type Compat string

// Supported compat modes.
const (
	CompatV51 Compat = "v51" // bind EADDRINUSE on any existing socket path; not-created errors are 500
	CompatV52 Compat = "v52" // as v51, plus RestoreConfig's resume and memory_restore_mode
	CompatV53 Compat = "v53" // OFD lock on <path>.lock, stale sockets unlinked; not-created errors are 404
)

// ParseCompat validates FAKECH_COMPAT (empty: v51).
func ParseCompat(s string) (Compat, error) {
	switch s {
	case "", "v51":
		return CompatV51, nil
	case "v52":
		return CompatV52, nil
	case "v53":
		return CompatV53, nil
	}
	return "", fmt.Errorf("%s=%q: want v51, v52 or v53", EnvCompat, s)
}

// BuildVersion is what --version and vmm.ping report.
func (c Compat) BuildVersion() string {
	switch c {
	case CompatV52:
		return "v52.0"
	case CompatV53:
		return "v53.0"
	}
	return "v51.0"
}

func (c Compat) crateVersion() string { return strings.TrimPrefix(c.BuildVersion(), "v") + ".0" }

// apiError is a VMM-side failure: the status and CH's error chain.
type apiError struct {
	status int
	chain  []string
}

func (e *apiError) Error() string { return strings.Join(e.chain, ": ") }

// chMsg is an error whose text is CH's own wording (capitalised, as CH
// prints it), kept verbatim because managers match on it.
type chMsg string

func (m chMsg) Error() string { return string(m) }

func vmmErr(status int, chain ...string) *apiError {
	return &apiError{status: status, chain: append([]string{"Error from API"}, chain...)}
}

// VMM is the fake VMM: a config (or none), a VM object (or none) with its
// guest and NICs. mu is CH's single VMM thread: every request holds it for
// its whole duration, so a long snapshot stalls vm.info and vmm.ping.
type VMM struct {
	mu      sync.Mutex
	compat  Compat
	clock   *clock
	vmID    string // failpoint attr "vm": the API socket's parent dir name
	log     *logger
	noShut  bool
	exitReq chan int // the process exits with the code sent here
	// exitAfter: the request in hand ends the process once its answer is
	// written (vmm.shutdown, guest poweroff); -1 when not.
	exitAfter int

	config  *chapi.VmConfig     // nil: no config
	state   string              // "" (no VM object), Running or Paused
	counter int                 // CH's shared device id counter
	slots   int                 // PCI slots handed out
	tree    map[string]*devNode // CH's device tree; nil without a VM object
	gen     uint64              // bumped when the VM object goes or is replaced
	guest   atomic.Pointer[guest]
	serial  *serialSocket           // --serial socket=, bound while a VM config has it
	disks   map[string]*os.File     // disk id → the image, open and advisory-locked while booted
	qcows   map[string]*qcow2.Image // disk id → its qcow2 chain, for a qcow2 image
	seed    map[string]string       // MAC → address from the cloud-init seed disk (TAP-only NICs)
	nics    *nicSet
	events  *eventMonitor // nil without --event-monitor
}

// NewVMM returns a VMM with no config.
func NewVMM(compat Compat, clk *clock, vmID string, log *logger, noShutdown bool) *VMM {
	v := &VMM{compat: compat, clock: clk, vmID: vmID, log: log, noShut: noShutdown, exitReq: make(chan int, 1), exitAfter: -1}
	v.nics = newNICSet(v)
	return v
}

func (v *VMM) hit(name string, attrs failpoint.Attrs) error {
	if !failpoint.Enabled() {
		return nil
	}
	if attrs == nil {
		attrs = failpoint.Attrs{}
	}
	attrs["vm"] = v.vmID
	return failpoint.Hit(context.Background(), name, attrs)
}

func (v *VMM) event(name string, props map[string]string) { v.events.emit("vm", name, props) }

func (v *VMM) sleep(d Duration) { _ = timescale.SleepRaw(context.Background(), v.clock.d(d)) }

// notCreated is the status of "VM is not created"/"VM config is missing":
// 500 up to v52, 404 from v53.
func (v *VMM) notCreated() int {
	if v.compat == CompatV53 {
		return 404
	}
	return 500
}

// Handle executes one decoded call under the VMM thread.
func (v *VMM) Handle(c *call) *response {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.log.debugf("api: %s", c.ep)
	resp, err := v.dispatch(c)
	if err != nil {
		var ae *apiError
		if !errors.As(err, &ae) {
			ae = vmmErr(500, err.Error())
		}
		v.log.infof("api: %s: %d %s", c.ep, ae.status, strings.Join(ae.chain, ": "))
		return chainResponse(ae.status, ae.chain...)
	}
	return resp
}

// afterReply ends the process if the request just answered asked for it.
func (v *VMM) afterReply() {
	v.mu.Lock()
	code := v.exitAfter
	v.exitAfter = -1
	v.mu.Unlock()
	if code >= 0 {
		select {
		case v.exitReq <- code:
		default:
		}
	}
}

func (v *VMM) dispatch(c *call) (*response, error) {
	switch c.ep {
	case chapi.EpPing:
		return jsonResponse(200, chapi.VmmPingResponse{BuildVersion: v.compat.BuildVersion(), Version: v.compat.crateVersion(),
			Pid: int64(os.Getpid()), Features: []string{"io_uring", "kvm"}}), nil
	case chapi.EpShutdownVMM:
		if v.state != "" {
			v.event("shutdown", nil)
		}
		v.teardown()
		_ = v.hit("ch.shutdown", nil)
		v.exitAfter = 0
		return &response{status: 200}, nil
	case chapi.EpCreate:
		return v.create(c.create)
	case chapi.EpBoot:
		return respNoContent, v.boot()
	case chapi.EpShutdown:
		return respNoContent, v.shutdown("The VM could not shutdown")
	case chapi.EpReboot:
		return respNoContent, v.reboot()
	case chapi.EpPowerButton:
		return respNoContent, v.powerButton()
	case chapi.EpPause:
		return respNoContent, v.pause()
	case chapi.EpResume:
		return respNoContent, v.resume()
	case chapi.EpSnapshot:
		return respNoContent, v.snapshot(c.snapshot.DestinationURL)
	case chapi.EpRestore:
		return respNoContent, v.Restore(*c.restore)
	case chapi.EpInfo:
		return v.info()
	case "vm.counters":
		return v.counters()
	case chapi.EpAddNet:
		return v.addNet(*c.net)
	case chapi.EpAddDisk:
		return v.addDisk(*c.disk)
	case chapi.EpRemoveDevice:
		return respNoContent, v.removeDevice(c.remove.ID)
	case chapi.EpDelete:
		if v.state != "" {
			v.sleep(v.clock.t.Shutdown)
			v.teardown()
			_ = v.hit("ch.shutdown", nil)
		}
		v.config = nil
		v.closeSerial()
		v.event("deleted", nil)
		return respNoContent, nil
	}
	return respNotFound, nil
}

func (v *VMM) create(cfg *chapi.VmConfig) (*response, error) {
	if v.config != nil {
		return nil, vmmErr(500, "The VM could not be created", "VM is already created")
	}
	fillDefaults(cfg)
	// CH stores the config, then pre-creates the console devices; a bind
	// failure leaves the config in place (lib.rs vm_create).
	v.config = cfg
	if err := v.openSerial(cfg); err != nil {
		return nil, vmmErr(500, append([]string{"The VM could not be created"}, chainOf(err)...)...)
	}
	return respNoContent, nil
}

// checkAddr enforces the fake backend's one network rule: guests live on
// loopback only, so fakech never binds anything reachable from outside.
func checkAddr(ip string) error {
	if ip == "" {
		return nil
	}
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return fmt.Errorf("invalid IP address %q: %w", ip, err)
	}
	if !a.Is4() || !netip.MustParsePrefix("127.0.0.0/8").Contains(a) {
		return fmt.Errorf("guest address %s is not in 127.0.0.0/8 (the fake backend only uses loopback)", ip)
	}
	return nil
}

// assignIDs gives every device without an id CH's auto id from the shared
// counter (disks first, then NICs) and rejects duplicates.
func (v *VMM) assignIDs(cfg *chapi.VmConfig) error {
	seen := map[string]bool{}
	check := func(id string) error {
		if strings.HasPrefix(id, "__") {
			return chMsg(fmt.Sprintf("Identifier %s is reserved", id))
		}
		if seen[id] {
			return chMsg(fmt.Sprintf("Identifier %s is not unique", id))
		}
		seen[id] = true
		return nil
	}
	for i := range cfg.Disks {
		if cfg.Disks[i].ID != "" {
			if err := check(cfg.Disks[i].ID); err != nil {
				return err
			}
		}
	}
	for i := range cfg.Net {
		if cfg.Net[i].ID != "" {
			if err := check(cfg.Net[i].ID); err != nil {
				return err
			}
		}
	}
	for i := range cfg.Disks {
		if cfg.Disks[i].ID == "" {
			cfg.Disks[i].ID = v.nextID("_disk", seen)
		}
	}
	for i := range cfg.Net {
		if cfg.Net[i].ID == "" {
			cfg.Net[i].ID = v.nextID("_net", seen)
		}
	}
	return nil
}

func (v *VMM) nextID(prefix string, seen map[string]bool) string {
	for {
		id := fmt.Sprintf("%s%d", prefix, v.counter)
		v.counter++
		if !seen[id] {
			seen[id] = true
			return id
		}
	}
}

func (v *VMM) allIDs() map[string]bool {
	seen := map[string]bool{}
	if v.config != nil {
		for _, d := range v.config.Disks {
			seen[d.ID] = true
		}
		for _, n := range v.config.Net {
			seen[n.ID] = true
		}
	}
	return seen
}

// boot creates the VM object from the config and starts the guest.
func (v *VMM) boot() error {
	const ctx = "The VM could not boot"
	if v.config == nil {
		return vmmErr(v.notCreated(), ctx, "VM config is missing")
	}
	if v.state != "" {
		return vmmErr(500, ctx, "VM is already created")
	}
	cfg := v.config
	if cfg.Payload == nil || (cfg.Payload.Kernel == "" && cfg.Payload.Firmware == "") {
		return vmmErr(500, ctx, "Error validating configuration", "No kernel or firmware specified")
	}
	for _, n := range cfg.Net {
		if err := checkAddr(n.IP); err != nil {
			return vmmErr(500, ctx, "Error creating VM", "Cannot create virtio-net device", err.Error())
		}
	}
	work := *cfg
	work.Disks = append([]chapi.DiskConfig(nil), cfg.Disks...)
	work.Net = append([]chapi.NetConfig(nil), cfg.Net...)
	if err := openDisks(work.Disks); err != nil {
		return vmmErr(500, append([]string{ctx}, chainOf(err)...)...)
	}
	saved := v.counter
	if err := v.assignIDs(&work); err != nil {
		v.counter = saved
		return vmmErr(500, ctx, "Error validating configuration", err.Error())
	}
	g, err := v.freshGuest(&work)
	if err != nil {
		v.counter = saved
		return vmmErr(500, ctx, "Error creating VM", err.Error())
	}
	if err := v.lockDisks(&work); err != nil {
		v.counter = saved
		return vmmErr(500, append([]string{ctx}, chainOf(err)...)...)
	}
	g.diskFile, g.diskQcow = v.bootDisk(&work), v.bootQcow(&work)
	v.seed = seedAddrs(&work)
	if err := v.nics.openPort(work.Net, g.port(), true); err != nil {
		v.counter = saved
		v.releaseDisks()
		return vmmErr(500, ctx, "Error creating VM", "Cannot create virtio-net device", err.Error())
	}
	v.event("booting", nil)
	v.config = &work
	v.slots = 3 + len(work.Disks) + len(work.Net)
	v.resetTree(&work)
	v.guest.Store(g)
	v.state = chapi.StateRunning
	g.setRunning(true)
	v.console("booted (boot id %s)", g.bootID)
	v.event("booted", nil)
	return wrapHit(v.hit("ch.boot", nil), ctx)
}

// openDisks is the device manager opening every disk image at boot: a
// missing one fails with CH's chain (vmm/src/device_manager.rs
// DeviceManagerError::Disk → "Cannot open disk path", block's I/O error
// naming the path; conformance TestRowCLIRules, "missing disk file").
func openDisks(disks []chapi.DiskConfig) error {
	for _, d := range disks {
		f, err := os.Open(d.Path)
		if err != nil {
			return chainErr{"Error from device manager", "Cannot open disk path",
				fmt.Sprintf("I/O error (path=%s op=open)", d.Path), osErrText(err)}
		}
		f.Close()
	}
	return nil
}

// freshGuest boots a new guest from the first disk.
func (v *VMM) freshGuest(cfg *chapi.VmConfig) (*guest, error) {
	bootTime := v.clock.d(v.clock.t.Boot)
	if len(cfg.Disks) == 0 {
		return newGuest("", nil, bootTime), nil
	}
	p := cfg.Disks[0].Path
	img, n, err := loadDisk(p)
	if errors.Is(err, errNotFake) {
		v.log.warnf("disk %s is not a fake guest image: the guest has no files and no SSH server", p)
		return newGuest("", nil, bootTime), nil
	}
	if err != nil {
		return nil, err
	}
	g := newGuest(p, img, bootTime)
	g.imgLen = n
	g.cloudInit(readSeed(cfg))
	return g, nil
}

func wrapHit(err error, ctx string) error {
	if err == nil {
		return nil
	}
	return vmmErr(500, ctx, err.Error())
}

// teardown drops the VM object: guest gone, NICs closed. The config stays.
func (v *VMM) teardown() {
	if g := v.guest.Swap(nil); g != nil {
		g.kill()
	}
	v.nics.closeAll()
	v.releaseDisks()
	v.state = ""
	v.tree = nil
	v.gen++
}

func (v *VMM) shutdown(ctx string) error {
	if v.state == "" {
		return vmmErr(500, ctx, "VM is not running")
	}
	v.event("shutdown", nil)
	v.sleep(v.clock.t.Shutdown)
	v.teardown()
	v.console("shut down")
	return wrapHit(v.hit("ch.shutdown", nil), ctx)
}

// reboot resets the VM in place: a fresh boot from the disk file, RAM and
// unsynced writes lost, a new boot id.
func (v *VMM) reboot() error {
	const ctx = "The VM could not reboot"
	if v.state == "" {
		// vm_reboot takes the VM object or fails VmNotCreated, config or
		// not (vmm/src/lib.rs Vmm::vm_reboot; conformance TestRowWrongStateOnCreatedVM).
		return vmmErr(v.notCreated(), ctx, "VM is not created")
	}
	g, err := v.freshGuest(v.config)
	if err != nil {
		return vmmErr(500, ctx, err.Error())
	}
	g.diskFile, g.diskQcow = v.bootDisk(v.config), v.bootQcow(v.config)
	if old := v.guest.Swap(g); old != nil {
		old.kill()
	}
	v.nics.dropConns()
	// CH rebuilds the VM from the config: a device whose eject was pending
	// is no longer in it, so it is gone from the new tree.
	for id, n := range v.tree {
		if n.Kind == "net" && !v.inConfig(id) {
			v.nics.close(id)
		}
	}
	v.gen++
	v.resetTree(v.config)
	v.state = chapi.StateRunning
	g.setRunning(true)
	v.console("rebooted (boot id %s)", g.bootID)
	v.event("rebooted", nil)
	return nil
}

// powerButton: the guest shuts itself down cleanly, so it syncs first; then
// the VMM exits 0 (or, with --no-shutdown, stays up with the VM Created).
func (v *VMM) powerButton() error {
	const ctx = "Error triggering power button"
	if v.state == "" {
		return vmmErr(500, ctx, "VM is not running")
	}
	if g := v.guest.Load(); g != nil {
		g.mu.Lock()
		err := g.syncLocked()
		g.mu.Unlock()
		if err != nil {
			v.log.warnf("guest poweroff: %v", err)
		}
	}
	v.event("shutdown", nil)
	v.sleep(v.clock.t.Shutdown)
	v.teardown()
	_ = v.hit("ch.shutdown", nil)
	if !v.noShut {
		v.exitAfter = 0
	}
	return nil
}

func (v *VMM) pause() error {
	const ctx = "The VM could not be paused"
	switch v.state {
	case "":
		return vmmErr(500, ctx, "VM is not running")
	case chapi.StatePaused:
		return vmmErr(500, ctx, "Cannot pause VM", "Failed to pause migratable component", "Invalid transition: InvalidStateTransition(Paused, Paused)")
	}
	v.event("pausing", nil)
	v.sleep(v.clock.t.Pause)
	v.guest.Load().setRunning(false)
	v.state = chapi.StatePaused
	v.event("paused", nil)
	return wrapHit(v.hit("ch.pause", nil), ctx)
}

func (v *VMM) resume() error {
	const ctx = "The VM could not resume"
	switch v.state {
	case "":
		return vmmErr(500, ctx, "VM is not running")
	case chapi.StateRunning:
		return vmmErr(500, ctx, "Cannot resume VM", "Failed to resume migratable component", "Invalid transition: InvalidStateTransition(Running, Running)")
	}
	v.event("resuming", nil)
	v.sleep(v.clock.t.Resume)
	v.guest.Load().setRunning(true)
	v.state = chapi.StateRunning
	v.event("resumed", nil)
	return wrapHit(v.hit("ch.resume", nil), ctx)
}

// snapshotState is state.json: the VMM-side state CH keeps besides RAM.
type snapshotState struct {
	Format     string `json:"format"`
	Build      string `json:"build_version"`
	State      string `json:"state"`
	Counter    int    `json:"device_id_counter"`
	Slots      int    `json:"pci_slots"`
	MemorySize int64  `json:"memory_size"`
	// Tree is the device manager's device tree (DeviceManagerState), with
	// the nodes whose eject was still pending.
	Tree []devNode `json:"device_tree"`
}

const stateFormat = "fakech-state-v1"

func fileURLPath(u string) (string, error) {
	p, ok := strings.CutPrefix(u, "file://")
	if !ok || !strings.HasPrefix(p, "/") {
		return "", chMsg("Could not extract path from URL: " + u)
	}
	return filepath.Clean(p), nil
}

func (v *VMM) memSize() int64 {
	if v.config != nil && v.config.Memory != nil && v.config.Memory.Size > 0 {
		return v.config.Memory.Size
	}
	return DefaultMemory
}

// snapshot captures the VM state, then writes the files in CH's order
// (vm.rs Vm::send, then MemoryManager::send): config.json, state.json, and
// last memory-ranges, the long part. Each is created new (0600): an existing
// file fails the snapshot there, after the earlier files were written, as in
// CH. A kill -9 during the memory write leaves config.json and state.json
// complete and memory-ranges partial. The VM must be paused and stays
// paused.
func (v *VMM) snapshot(url string) error {
	const ctx = "The VM could not be snapshotted"
	switch v.state {
	case "":
		return vmmErr(500, ctx, "VM is not running")
	case chapi.StateRunning:
		return vmmErr(500, ctx, "Cannot snapshot VM", "Failed to snapshot migratable component", "Trying to snapshot while VM is running")
	}
	dir, err := fileURLPath(url)
	if err != nil {
		return vmmErr(500, ctx, "Cannot send VM snapshot", err.Error())
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return vmmErr(500, ctx, "Cannot send VM snapshot", fmt.Sprintf("Destination is not a directory: %q", dir))
	}
	if err := v.hit("ch.snapshot.begin", failpoint.Attrs{"dir": dir}); err != nil {
		return vmmErr(500, ctx, err.Error())
	}
	v.event("snapshotting", nil)
	// Vm::snapshot: CPU, memory-manager and device state in memory first.
	mem := v.guest.Load().capture()
	st := snapshotState{Format: stateFormat, Build: v.compat.BuildVersion(), State: v.state, Counter: v.counter,
		Slots: v.slots, MemorySize: v.memSize(), Tree: v.treeNodes()}
	v.sleep(v.clock.t.SnapshotFixed)
	cfgJSON, _ := json.Marshal(v.config)
	stJSON, _ := json.Marshal(st)
	memJSON, _ := json.Marshal(mem)
	if err := writeNew(filepath.Join(dir, "config.json"), cfgJSON, 0, nil); err != nil {
		return vmmErr(500, ctx, "Cannot send VM snapshot", "Error creating VM config snapshot file", osErrText(err))
	}
	if err := writeNew(filepath.Join(dir, "state.json"), stJSON, 0, nil); err != nil {
		return vmmErr(500, ctx, "Cannot send VM snapshot", "Error creating VM state snapshot file", osErrText(err))
	}
	// v53 pre-sizes memory-ranges (set_len) before writing the ranges; v51
	// and v52 grow it as they write.
	presize := int64(0)
	if v.compat == CompatV53 {
		presize = int64(len(memJSON))
	}
	mp := filepath.Join(dir, "memory-ranges")
	perGiBTime := v.clock.d(perGiB(v.clock.t.SnapshotPerGiB, v.memSize()))
	if err := writeNew(mp, memJSON, presize, func() {
		// Half the ranges are on disk: a kill here leaves CH's debris.
		_ = v.hit("ch.snapshot.memory-writing", failpoint.Attrs{"dir": dir})
		_ = timescale.SleepRaw(context.Background(), perGiBTime)
	}); err != nil {
		return vmmErr(500, ctx, "Cannot send VM snapshot", fmt.Sprintf("Error creating memory snapshot file %q", mp), osErrText(err))
	}
	if err := v.hit("ch.snapshot.memory-written", failpoint.Attrs{"dir": dir}); err != nil {
		return vmmErr(500, ctx, err.Error())
	}
	v.event("snapshotted", nil)
	return wrapHit(v.hit("ch.snapshot.done", failpoint.Attrs{"dir": dir}), ctx)
}

// writeNew creates path (O_EXCL, 0600) and writes b. size > 0 sets the file
// length first. mid, when set, runs between the two halves of the write: the
// time a large write takes, during which a kill leaves a partial file.
func writeNew(path string, b []byte, size int64, mid func()) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if size > 0 {
		if err := f.Truncate(size); err != nil {
			return err
		}
	}
	half := 0
	if mid != nil {
		half = len(b) / 2
		if _, err := f.WriteAt(b[:half], 0); err != nil {
			return err
		}
		mid()
	}
	_, err = f.WriteAt(b[half:], int64(half))
	return err
}

// osErrText renders an error the way Rust's io::Error prints: "File exists (os error 17)".
func osErrText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		s := errno.Error()
		return strings.ToUpper(s[:1]) + s[1:] + fmt.Sprintf(" (os error %d)", int(errno))
	}
	return err.Error()
}

// readSnapshot reads a snapshot dir fakech wrote: config.json, state.json
// and memory-ranges.
func readSnapshot(dir string) (chapi.VmConfig, snapshotState, memoryImage, error) {
	var cfg chapi.VmConfig
	var st snapshotState
	var mem memoryImage
	for _, f := range []struct {
		name string
		dst  any
	}{{"config.json", &cfg}, {"state.json", &st}, {"memory-ranges", &mem}} {
		b, err := os.ReadFile(filepath.Join(dir, f.name))
		if err != nil {
			return cfg, st, mem, chMsg("Failed to read snapshot file: " + osErrText(err))
		}
		if err := json.Unmarshal(b, f.dst); err != nil {
			return cfg, st, mem, chMsg(fmt.Sprintf("Failed to parse %s: %v", f.name, err))
		}
	}
	if st.Format != stateFormat || mem.Format != memoryFormat {
		return cfg, st, mem, fmt.Errorf("snapshot in %s was not written by fakech (state %q, memory %q)", dir, st.Format, mem.Format)
	}
	return cfg, st, mem, nil
}

// restoredGuest rebuilds the guest from its first disk and memory-ranges.
func restoredGuest(cfg *chapi.VmConfig, mem *memoryImage) (*guest, error) {
	if len(cfg.Disks) == 0 {
		return restoreGuest("", nil, mem), nil
	}
	img, n, err := loadDisk(cfg.Disks[0].Path)
	switch {
	case errors.Is(err, errNotFake):
		return restoreGuest("", nil, mem), nil
	case err != nil:
		return nil, err
	}
	g := restoreGuest(cfg.Disks[0].Path, img, mem)
	g.imgLen = n
	return g, nil
}

// restoreTree takes the device tree from the snapshot as it was
// (DeviceManager::new): a node whose eject was pending, or whose device the
// config no longer has, comes back without a device behind it and keeps its
// id taken. Devices of cfg the tree lacks get new slots.
func (v *VMM) restoreTree(st *snapshotState, cfg *chapi.VmConfig) {
	v.counter, v.slots = st.Counter, st.Slots
	v.gen++
	v.tree = map[string]*devNode{}
	for _, n := range st.Tree {
		n.Ejecting = false
		v.tree[n.ID] = &n
	}
	if st.Tree == nil { // a state.json from before the tree was kept
		v.resetTree(cfg)
	}
	for _, d := range cfg.Disks {
		if v.tree[d.ID] == nil {
			v.tree[d.ID] = &devNode{ID: d.ID, Kind: "disk", Slot: v.slots}
			v.slots++
		}
	}
	for _, n := range cfg.Net {
		if v.tree[n.ID] == nil {
			v.tree[n.ID] = &devNode{ID: n.ID, Kind: "net", Slot: v.slots, IP: n.IP}
			v.slots++
		}
	}
}

// Restore loads a snapshot into a VMM with no config; the VM comes back
// Paused (or Running with resume). Disks come from config.json, RAM from
// memory-ranges.
func (v *VMM) Restore(rc chapi.RestoreConfig) error {
	const ctx = "The VM could not be restored"
	if v.config != nil {
		return vmmErr(500, ctx, "VM is already created")
	}
	fail := func(err error) error { return vmmErr(500, ctx, "Cannot restore VM", err.Error()) }
	if v.compat == CompatV51 {
		// v51's RestoreConfig has only source_url, prefault and net_fds
		// (vmm/src/config.rs); serde ignores the rest, so a JSON
		// "resume":true leaves the VM Paused.
		rc.Resume, rc.MemoryRestoreMode = false, ""
	}
	if rc.MemoryRestoreMode != "" && rc.MemoryRestoreMode != "Copy" && rc.MemoryRestoreMode != "OnDemand" {
		return fail(fmt.Errorf("invalid memory_restore_mode %q", rc.MemoryRestoreMode))
	}
	if rc.MemoryRestoreMode == "OnDemand" && rc.Prefault {
		return fail(errors.New("prefault is not compatible with OnDemand memory restore"))
	}
	dir, err := fileURLPath(rc.SourceURL)
	if err != nil {
		return fail(err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		// CH's recv_vm_config checks the directory first, with the send
		// error's wording (conformance TestRowRestoreOptions).
		return vmmErr(500, ctx, "Cannot restore VM", "Failed to send migratable component snapshot", fmt.Sprintf("Destination is not a directory: %q", dir))
	}
	cfg, st, mem, err := readSnapshot(dir)
	if err != nil {
		return fail(err)
	}
	if err := v.hit("ch.restore.begin", failpoint.Attrs{"dir": dir}); err != nil {
		return vmmErr(500, ctx, err.Error())
	}
	v.event("restoring", nil)
	fillDefaults(&cfg)
	for _, n := range cfg.Net {
		if err := checkAddr(n.IP); err != nil {
			return fail(err)
		}
	}
	g, err := restoredGuest(&cfg, &mem)
	if err != nil {
		return fail(err)
	}
	if err := v.openSerial(&cfg); err != nil {
		return vmmErr(500, append([]string{ctx}, chainOf(err)...)...)
	}
	// On a failure CH deletes the half-built VM; the VMM stays, with no VM.
	if err := v.lockDisks(&cfg); err != nil {
		v.closeSerial()
		return vmmErr(500, append([]string{ctx}, chainOf(err)...)...)
	}
	g.diskFile, g.diskQcow = v.bootDisk(&cfg), v.bootQcow(&cfg)
	v.config = &cfg
	v.sleep(v.clock.t.RestoreFixed + perGiB(v.clock.t.RestorePerGiB, v.memSize()))
	v.seed = seedAddrs(&cfg)
	// The restored NICs are best effort: the snapshot's source VM may still
	// hold its address (a clone), and the manager replaces NICs anyway.
	_ = v.nics.openPort(cfg.Net, g.port(), false)
	v.restoreTree(&st, &cfg)
	v.guest.Store(g)
	v.state = chapi.StatePaused
	v.event("restored", nil)
	if err := v.hit("ch.restore.done", failpoint.Attrs{"dir": dir}); err != nil {
		return vmmErr(500, ctx, err.Error())
	}
	if rc.Resume {
		g.setRunning(true)
		v.state = chapi.StateRunning
	}
	v.console("restored (boot id %s)", g.bootID)
	return nil
}

func (v *VMM) info() (*response, error) {
	if v.config == nil {
		return nil, vmmErr(v.notCreated(), "The VM info is not available", "VM is not created")
	}
	info := chapi.VmInfo{Config: *v.config, State: chapi.StateCreated, MemoryActualSize: v.memSize()}
	if v.state != "" {
		info.State = v.state
		info.DeviceTree = v.deviceTree()
	}
	return jsonResponse(200, info), nil
}

func (v *VMM) counters() (*response, error) {
	if v.state == "" {
		return nil, vmmErr(500, "The VM info is not available", "VM is not running")
	}
	out := map[string]map[string]uint64{}
	for _, d := range v.config.Disks {
		out[d.ID] = map[string]uint64{"read_bytes": 0, "write_bytes": 0, "read_ops": 0, "write_ops": 0}
	}
	for _, n := range v.config.Net {
		out[n.ID] = map[string]uint64{"rx_bytes": 0, "tx_bytes": 0, "rx_frames": 0, "tx_frames": 0}
	}
	return jsonResponse(200, out), nil
}

// addNet hot-plugs a NIC on a booted VM (its address starts answering SSH)
// or just records it in the config of a created one.
func (v *VMM) addNet(n chapi.NetConfig) (*response, error) {
	const ctx = "The network device could not be added to the VM"
	if v.config == nil {
		return nil, vmmErr(v.notCreated(), ctx, "VM is not created")
	}
	if err := checkAddr(n.IP); err != nil {
		return nil, vmmErr(500, ctx, "Failed to add net device", err.Error())
	}
	seen := v.allIDs()
	if n.ID != "" && (seen[n.ID] || strings.HasPrefix(n.ID, "__")) {
		return nil, vmmErr(500, ctx, "Failed to validate config", fmt.Sprintf("Identifier %s is not unique", n.ID))
	}
	if err := v.checkTreeID(n.ID, ctx); err != nil {
		return nil, err
	}
	if n.NumQueues == 0 {
		n.NumQueues = 2
	}
	if n.QueueSize == 0 {
		n.QueueSize = 256
	}
	if v.state == "" {
		v.config.Net = append(v.config.Net, n)
		return respNoContent, nil
	}
	saved := v.counter
	if n.ID == "" {
		n.ID = v.nextID("_net", seen)
	}
	if err := v.nics.openPort([]chapi.NetConfig{n}, v.guest.Load().port(), true); err != nil {
		v.counter = saved
		return nil, vmmErr(500, ctx, "Failed to add net device", err.Error())
	}
	v.sleep(v.clock.t.AddDevice)
	v.config.Net = append(v.config.Net, n)
	v.tree[n.ID] = &devNode{ID: n.ID, Kind: "net", Slot: v.slots, IP: n.IP}
	bdf := fmt.Sprintf("0000:00:%02x.0", v.slots)
	v.slots++
	if err := v.hit("ch.net.added", failpoint.Attrs{"nic": n.ID, "ip": n.IP}); err != nil {
		return nil, vmmErr(500, ctx, err.Error())
	}
	return jsonResponse(200, chapi.PciDeviceInfo{ID: n.ID, Bdf: bdf}), nil
}

func (v *VMM) addDisk(d chapi.DiskConfig) (*response, error) {
	const ctx = "The disk could not be added to the VM"
	if v.config == nil {
		return nil, vmmErr(v.notCreated(), ctx, "VM is not created")
	}
	seen := v.allIDs()
	if d.ID != "" && seen[d.ID] {
		return nil, vmmErr(500, ctx, "Failed to validate config", fmt.Sprintf("Identifier %s is not unique", d.ID))
	}
	if err := v.checkTreeID(d.ID, ctx); err != nil {
		return nil, err
	}
	if d.ImageType == "" {
		d.ImageType = "Raw"
	}
	if v.state == "" {
		v.config.Disks = append(v.config.Disks, d)
		return respNoContent, nil
	}
	if _, err := os.Stat(d.Path); err != nil {
		return nil, vmmErr(500, ctx, "Failed to add disk", osErrText(err))
	}
	if d.ID == "" {
		d.ID = v.nextID("_disk", seen)
	}
	// A hot-plugged disk is locked at once (device_manager.rs, is_hotplug).
	f, err := lockImage(d.Path, d.Readonly)
	if err != nil {
		return nil, vmmErr(500, append([]string{ctx, "Error from device manager"}, chainOf(err)...)...)
	}
	if v.disks == nil {
		v.disks = map[string]*os.File{}
	}
	v.disks[d.ID] = f
	v.sleep(v.clock.t.AddDevice)
	v.config.Disks = append(v.config.Disks, d)
	v.tree[d.ID] = &devNode{ID: d.ID, Kind: "disk", Slot: v.slots}
	bdf := fmt.Sprintf("0000:00:%02x.0", v.slots)
	v.slots++
	return jsonResponse(200, chapi.PciDeviceInfo{ID: d.ID, Bdf: bdf}), nil
}

// removeDevice unplugs a device. On a VM without a VM object it only edits
// the config. On a booted VM it is CH's hot-unplug: the device leaves the
// config at once and the guest is asked to eject it; the node (and a NIC's
// address) stays until the guest acks (devtree.go).
func (v *VMM) removeDevice(id string) error {
	const ctx = "The device could not be removed from the VM"
	if v.config == nil {
		return vmmErr(v.notCreated(), ctx, "VM is not created")
	}
	if v.state == "" {
		if v.removeFromConfig(id) {
			return nil
		}
		return vmmErr(500, ctx, fmt.Sprintf("No device with id %q to remove", id))
	}
	const dm = "Error from device manager"
	n := v.tree[id]
	switch {
	case n == nil, n.Ejecting:
		// A second remove of an ejecting device: the tree has it, the config
		// no longer does (config.remove_device returns false).
		return vmmErr(500, ctx, dm, v.unknownDevice(id))
	case v.orphan(n):
		return vmmErr(500, ctx, dm, "Missing PCI device")
	}
	v.removeFromConfig(id)
	// remove_device drops the block device at once, and its lock with it.
	v.releaseDisk(id)
	v.sleep(v.clock.t.RemoveDevice)
	notify, err := v.requestEject(n)
	defer notify()
	if err != nil {
		return wrapHit(err, ctx)
	}
	if n.Kind == "net" {
		return wrapHit(v.hit("ch.net.removed", failpoint.Attrs{"nic": id, "ip": n.IP}), ctx)
	}
	return nil
}

// unknownDevice is DeviceManagerError::UnknownDeviceId's text: v53 names the
// id, v51/v52 do not.
func (v *VMM) unknownDevice(id string) string {
	if v.compat == CompatV53 {
		return "Failed to find device corresponding to the given identifier: " + id
	}
	return "Failed to find device corresponding to the given identifier"
}

func (v *VMM) removeFromConfig(id string) bool {
	for i, n := range v.config.Net {
		if n.ID == id {
			v.config.Net = append(v.config.Net[:i:i], v.config.Net[i+1:]...)
			return true
		}
	}
	for i, d := range v.config.Disks {
		if d.ID == id {
			v.config.Disks = append(v.config.Disks[:i:i], v.config.Disks[i+1:]...)
			return true
		}
	}
	return false
}

// checkTreeID is DeviceManager::validate_identifier on a booted VM: an id
// still in the device tree (an eject not yet acked, or a node a restore
// brought back) is refused even though the config no longer has it.
func (v *VMM) checkTreeID(id, ctx string) error {
	if id == "" || v.tree == nil || v.tree[id] == nil {
		return nil
	}
	return vmmErr(500, ctx, "Error from device manager", "Invalid identifier as it is not unique: "+id)
}

// console writes a line to the serial/console file, if one is configured,
// so a manager's log capture sees the guest come and go.
func (v *VMM) console(format string, a ...any) {
	if v.config == nil {
		return
	}
	line := fmt.Sprintf("[%s] fakech guest: %s\n", time.Now().UTC().Format(time.RFC3339Nano), fmt.Sprintf(format, a...))
	if v.serial != nil {
		v.serial.write(line)
	}
	for _, c := range []*chapi.ConsoleConfig{v.config.Serial, v.config.Console} {
		if c == nil || c.Mode != "File" || c.File == "" {
			continue
		}
		f, err := os.OpenFile(c.File, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			v.log.warnf("console %s: %v", c.File, err)
			continue
		}
		_, _ = f.WriteString(line)
		f.Close()
	}
}
