package ledger

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/fakech/guestimg"
	"github.com/vmchaos/vmchaos/stackbin"
	"golang.org/x/crypto/ssh"
)

// These tests run the ledger against real fakech guests: the fakech binary,
// its guest SSH server, its page cache and sync, its memory snapshot and
// restore. Hibernate and wake are done through the CH API the way vmctl does
// them, without vmctl: pause → snapshot → kill the VMM → a new VMM with
// --api-socket only → vm.restore → vm.resume.

// fakechScale makes the fake guest's boot, pause, snapshot and restore short;
// the ledger's own timers stay at scale 1.
const fakechScale = "0.05"

// testBudget is a safety net for one test, not a timing assertion.
const testBudget = 2 * time.Minute

// rig is one test's run dir, run key, guest image and ledger.
type rig struct {
	t      testing.TB
	dir    string
	key    *Key
	img    string
	ip     string
	guest  Guest
	ledger *Ledger
	vmms   int
}

func newRig(t testing.TB, name string) *rig {
	t.Helper()
	dir := t.TempDir()
	key, err := NewKey(filepath.Join(dir, "ssh"))
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, dir: dir, key: key, img: filepath.Join(dir, "guest.img"), ip: randomLoopback()}
	img, err := guestimg.Build(r.img, guestimg.Options{AuthorizedKeys: []string{key.AuthorizedKey()}, Hostname: name})
	if err != nil {
		t.Fatal(err)
	}
	r.guest = Guest{Name: name, Addr: net.JoinHostPort(r.ip, strconv.Itoa(img.SSHPort))}
	r.ledger, err = Open(filepath.Join(dir, "results", "ledger.jsonl"), key, filepath.Join(dir, "known_hosts"))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// randomLoopback picks an address in 127.0.0.0/8 away from 127.0.0.1, so
// parallel tests (and colleagues' tests) do not collide on a guest port.
func randomLoopback() string {
	return fmt.Sprintf("127.%d.%d.%d", 10+rand.IntN(240), rand.IntN(256), 2+rand.IntN(250))
}

// vmm is one started fakech process.
type vmm struct {
	cmd  *exec.Cmd
	sock string
	api  *chapi.Client
	done chan struct{}
}

// start launches fakech with args after --api-socket, waits until it answers
// ping, and makes sure it is killed and reaped when the test ends.
func (r *rig) start(ctx context.Context, args ...string) *vmm {
	r.t.Helper()
	bin, err := stackbin.Path("fakech")
	if err != nil {
		r.t.Fatal(err)
	}
	r.vmms++
	sock := filepath.Join(r.dir, fmt.Sprintf("api-%d.sock", r.vmms))
	log, err := os.Create(filepath.Join(r.dir, fmt.Sprintf("fakech-%d.log", r.vmms)))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { log.Close() })
	cmd := exec.Command(bin, append([]string{"--api-socket", "path=" + sock}, args...)...)
	cmd.Env = append(os.Environ(), "VMCHAOS_TIME_SCALE="+fakechScale)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	v := &vmm{cmd: cmd, sock: sock, api: chapi.New(sock), done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(v.done) }()
	r.t.Cleanup(v.kill)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := v.api.WaitReady(wctx); err != nil {
		b, _ := os.ReadFile(log.Name())
		r.t.Fatalf("fakech %v: %v\n%s", args, err, b)
	}
	return v
}

// kill SIGKILLs the VMM by its recorded pid and reaps it.
func (v *vmm) kill() {
	select {
	case <-v.done:
		return
	default:
	}
	_ = v.cmd.Process.Signal(syscall.SIGKILL)
	<-v.done
}

// boot starts a fresh guest from the disk image with the rig's NIC.
func (r *rig) boot(ctx context.Context) *vmm {
	r.t.Helper()
	return r.start(ctx, "--firmware", "x", "--disk", "path="+r.img, "--net", "ip="+r.ip)
}

// hibernate pauses the guest, snapshots it into a new dir and kills the VMM,
// as a hibernate does between save and vm rm.
func (r *rig) hibernate(ctx context.Context, v *vmm) string {
	r.t.Helper()
	if err := v.api.Pause(ctx, true); err != nil {
		r.t.Fatalf("pause: %v", err)
	}
	snap := filepath.Join(r.dir, fmt.Sprintf("snap-%d", r.vmms))
	if err := os.MkdirAll(snap, 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := v.api.Snapshot(ctx, snap); err != nil {
		r.t.Fatalf("snapshot: %v", err)
	}
	v.kill()
	return snap
}

// wake restores snap into a new VMM and resumes it. The restored config
// keeps the NIC, so the guest answers on the same address.
func (r *rig) wake(ctx context.Context, snap string) *vmm {
	r.t.Helper()
	v := r.start(ctx)
	if err := v.api.Restore(ctx, chapi.RestoreConfig{SourceURL: "file://" + snap}); err != nil {
		r.t.Fatalf("restore: %v", err)
	}
	if err := v.api.Resume(ctx, false); err != nil {
		r.t.Fatalf("resume: %v", err)
	}
	return v
}

func (r *rig) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testBudget)
	r.t.Cleanup(cancel)
	return ctx
}

// TestHibernateWakeCyclesStayClean: create → marker → hibernate → wake →
// verify, three times in a row on one guest; every marker stays stable and
// the memory (RAM markers, boot id) survives every wake.
func TestHibernateWakeCyclesStayClean(t *testing.T) {
	r := newRig(t, "cycles")
	ctx := r.ctx()
	v := r.boot(ctx)
	var boot string
	for cycle := 1; cycle <= 3; cycle++ {
		m, err := r.ledger.WriteMarkers(ctx, r.guest, cycle)
		if err != nil {
			t.Fatalf("cycle %d: %v", cycle, err)
		}
		id, err := r.ledger.RecordBootID(ctx, r.guest)
		if err != nil {
			t.Fatal(err)
		}
		if id != m.BootID || (boot != "" && id != boot) {
			t.Fatalf("cycle %d: boot id %s, marker acked under %s, first boot %s", cycle, id, m.BootID, boot)
		}
		boot = id
		v = r.wake(ctx, r.hibernate(ctx, v))
		verdict, err := r.ledger.Verify(ctx, r.guest, VerifyOpts{ExpectRAM: true})
		if err != nil {
			t.Fatalf("cycle %d: verify: %v", cycle, err)
		}
		if !verdict.OK || verdict.Stable != cycle || verdict.InFlight != 0 || verdict.BootIDAfter != boot {
			t.Fatalf("cycle %d: %+v", cycle, verdict)
		}
		t.Logf("cycle %d: %s", cycle, verdict.Message)
	}
	entries, torn, err := ReadJournal(r.ledger.JournalPath())
	if err != nil || torn || len(entries) != 9 {
		t.Fatalf("journal: %d entries torn=%v err=%v", len(entries), torn, err)
	}
}

// TestLostMarkerFailsVerdict: a marker deleted behind the ledger's back
// (removed and synced in the guest) is LOST after the wake, by name.
func TestLostMarkerFailsVerdict(t *testing.T) {
	r := newRig(t, "lost")
	ctx := r.ctx()
	v := r.boot(ctx)
	keep, err := r.ledger.WriteMarkers(ctx, r.guest, 1)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := r.ledger.WriteMarkers(ctx, r.guest, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.ledger.Exec(ctx, r.guest, "rm -f "+gone.DiskPath+" && sync"); err != nil {
		t.Fatal(err)
	}
	v = r.wake(ctx, r.hibernate(ctx, v))
	verdict, err := r.ledger.Verify(ctx, r.guest, VerifyOpts{ExpectRAM: true})
	if err != nil {
		t.Fatal(err)
	}
	if verdict.OK || verdict.Lost != 1 || len(verdict.LostNames) != 1 || verdict.LostNames[0] != gone.Name ||
		verdict.Stable != 1 || !strings.Contains(verdict.Message, "LOST") || !strings.Contains(verdict.Message, gone.Name) {
		t.Fatalf("verdict %+v (kept %s)", verdict, keep.Name)
	}
	_ = v
}

// TestPhantomFailsVerdict: a file placed in the ledger dir that the journal
// never saw is a PHANTOM, by name.
func TestPhantomFailsVerdict(t *testing.T) {
	r := newRig(t, "phantom")
	ctx := r.ctx()
	r.boot(ctx)
	if _, err := r.ledger.WriteMarkers(ctx, r.guest, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ledger.Exec(ctx, r.guest, "touch "+DiskDir+"/stranger && sync"); err != nil {
		t.Fatal(err)
	}
	verdict, err := r.ledger.Verify(ctx, r.guest, VerifyOpts{})
	if err != nil {
		t.Fatal(err)
	}
	if verdict.OK || verdict.Phantom != 1 || verdict.PhantomNames[0] != "stranger" || verdict.Stable != 1 ||
		!strings.Contains(verdict.Message, "PHANTOM") {
		t.Fatalf("verdict %+v", verdict)
	}
}

// TestInterruptedWriteIsInFlight: a runner SIGKILLed between intent and
// ack — once before it touched the guest, once after the guest confirmed —
// leaves markers classified in-flight, and the verdict passes with the marker
// present and with it absent.
func TestInterruptedWriteIsInFlight(t *testing.T) {
	r := newRig(t, "inflight")
	ctx := r.ctx()
	v := r.boot(ctx)
	if _, err := r.ledger.WriteMarkers(ctx, r.guest, 1); err != nil {
		t.Fatal(err)
	}
	for _, point := range []string{"ledger.marker.intent", "ledger.marker.written"} {
		h := startHelper(t, "write-marker",
			"VMCHAOS_FAILPOINTS="+point+"=kill",
			"LEDGER_JOURNAL="+r.ledger.JournalPath(), "LEDGER_KEYDIR="+filepath.Dir(r.key.PrivatePath()),
			"LEDGER_PINS="+r.ledger.pins.path, "LEDGER_GUEST="+r.guest.Name, "LEDGER_ADDR="+r.guest.Addr)
		err := h.cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("%s: helper not killed by its failpoint: %v; stderr: %s", point, err, h.stderr)
		}
	}
	v = r.wake(ctx, r.hibernate(ctx, v))
	verdict, err := r.ledger.Verify(ctx, r.guest, VerifyOpts{ExpectRAM: true})
	if err != nil {
		t.Fatal(err)
	}
	if !verdict.OK || verdict.InFlight != 2 || verdict.Stable != 1 {
		t.Fatalf("verdict %+v", verdict)
	}
	// Exactly one of the two interrupted markers reached the guest: the
	// one killed after the guest confirmed it.
	out, err := r.ledger.Exec(ctx, r.guest, "ls -1 "+DiskDir)
	if err != nil {
		t.Fatal(err)
	}
	present := 0
	for _, n := range verdict.InFlightNames {
		if strings.Contains(out, n) {
			present++
		}
	}
	if present != 1 {
		t.Fatalf("in-flight markers on disk: %d of %v in %q", present, verdict.InFlightNames, out)
	}
	_ = v
}

// TestFreshBootOverHibernateSnapshotFails: the wake boots a new VMM from the
// disk image instead of restoring the memory snapshot. The synced disk
// markers are there, but the RAM markers are gone and the boot id changed,
// and the verdict says the wake booted fresh over the hibernate snapshot.
func TestFreshBootOverHibernateSnapshotFails(t *testing.T) {
	r := newRig(t, "freshboot")
	ctx := r.ctx()
	v := r.boot(ctx)
	m, err := r.ledger.WriteMarkers(ctx, r.guest, 1)
	if err != nil {
		t.Fatal(err)
	}
	before, err := r.ledger.RecordBootID(ctx, r.guest)
	if err != nil {
		t.Fatal(err)
	}
	r.hibernate(ctx, v)
	r.boot(ctx) // the bug: a fresh boot from the disk, the snapshot ignored
	verdict, err := r.ledger.Verify(ctx, r.guest, VerifyOpts{ExpectRAM: true})
	if err != nil {
		t.Fatal(err)
	}
	if verdict.OK || !verdict.BootIDChanged || verdict.BootIDBefore != before || verdict.BootIDAfter == before ||
		len(verdict.RAMMissing) != 1 || verdict.RAMMissing[0] != m.Name || verdict.Stable != 1 || verdict.Lost != 0 {
		t.Fatalf("verdict %+v", verdict)
	}
	if !strings.Contains(verdict.Message, "booted fresh over a hibernate snapshot") {
		t.Fatalf("message %q", verdict.Message)
	}
	t.Log(verdict.Message)
	// The same guest, when the scenario declares why a cold boot was
	// legitimate (its VMM was killed before the save), passes with the
	// boot id change reported.
	declared, err := r.ledger.Verify(ctx, r.guest, VerifyOpts{ExpectRAM: true, ColdBootAllowed: "VMM killed before the save"})
	if err != nil {
		t.Fatal(err)
	}
	if !declared.OK || !declared.BootIDChanged || !strings.Contains(declared.Message, "accepted: VMM killed before the save") {
		t.Fatalf("declared cold boot: %+v", declared)
	}
}

// TestChangedHostKeyRefused: the guest's host key is pinned at first
// contact; a different machine (an image with another host key) answering at
// the guest's address is refused at once, and the pin is not replaced.
func TestChangedHostKeyRefused(t *testing.T) {
	r := newRig(t, "hostkey")
	ctx := r.ctx()
	v := r.boot(ctx)
	if _, err := r.ledger.WriteMarkers(ctx, r.guest, 1); err != nil {
		t.Fatal(err)
	}
	pins, err := os.ReadFile(r.ledger.pins.path)
	if err != nil || !strings.HasPrefix(string(pins), r.guest.Name+" ssh-ed25519 ") {
		t.Fatalf("pin after first contact: %q %v", pins, err)
	}
	v.kill()
	other, err := guestimg.Build(r.img, guestimg.Options{AuthorizedKeys: []string{r.key.AuthorizedKey()}, Hostname: "impostor"})
	if err != nil {
		t.Fatal(err)
	}
	r.boot(ctx)
	_, err = r.ledger.Verify(ctx, r.guest, VerifyOpts{})
	if !errors.Is(err, ErrHostKeyChanged) {
		t.Fatalf("want ErrHostKeyChanged, got %v", err)
	}
	pub, _ := other.HostPublicKey()
	if ctx.Err() != nil || !strings.Contains(err.Error(), r.guest.Name) || !strings.Contains(err.Error(), ssh.FingerprintSHA256(pub)) {
		t.Fatalf("error %v (ctx %v)", err, ctx.Err())
	}
	after, _ := os.ReadFile(r.ledger.pins.path)
	if string(after) != string(pins) {
		t.Fatalf("pins changed: %q → %q", pins, after)
	}
	t.Log(err)
}

// TestWriteWaitsForWakingGuest: a write issued while the guest is
// hibernated (no VMM, connection refused) keeps retrying and lands once the
// wake brings the guest back.
func TestWriteWaitsForWakingGuest(t *testing.T) {
	r := newRig(t, "waking")
	ctx := r.ctx()
	v := r.boot(ctx)
	if _, err := r.ledger.WriteMarkers(ctx, r.guest, 1); err != nil {
		t.Fatal(err)
	}
	snap := r.hibernate(ctx, v)
	type result struct {
		m   Marker
		err error
	}
	res := make(chan result, 1)
	go func() {
		m, err := r.ledger.WriteMarkers(ctx, r.guest, 2)
		res <- result{m, err}
	}()
	r.wake(ctx, snap)
	got := <-res
	if got.err != nil {
		t.Fatal(got.err)
	}
	verdict, err := r.ledger.Verify(ctx, r.guest, VerifyOpts{ExpectRAM: true})
	if err != nil || !verdict.OK || verdict.Stable != 2 {
		t.Fatalf("verdict %+v err %v", verdict, err)
	}
}

// TestWakeFromStaleSnapshotFails: a wake that restores the previous cycle's
// snapshot instead of the latest one brings back memory without the latest
// RAM marker (the boot id is the same boot), and the verdict names it.
func TestWakeFromStaleSnapshotFails(t *testing.T) {
	r := newRig(t, "stale")
	ctx := r.ctx()
	v := r.boot(ctx)
	if _, err := r.ledger.WriteMarkers(ctx, r.guest, 1); err != nil {
		t.Fatal(err)
	}
	stale := r.hibernate(ctx, v)
	v = r.wake(ctx, stale)
	latest, err := r.ledger.WriteMarkers(ctx, r.guest, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.ledger.RecordBootID(ctx, r.guest); err != nil {
		t.Fatal(err)
	}
	r.hibernate(ctx, v)
	r.wake(ctx, stale) // the bug: the wake picked the older snapshot
	verdict, err := r.ledger.Verify(ctx, r.guest, VerifyOpts{ExpectRAM: true})
	if err != nil {
		t.Fatal(err)
	}
	if verdict.OK || verdict.BootIDChanged || len(verdict.RAMMissing) != 1 || verdict.RAMMissing[0] != latest.Name ||
		!strings.Contains(verdict.Message, "memory not restored intact") {
		t.Fatalf("verdict %+v", verdict)
	}
	t.Log(verdict.Message)
}

// TestDialHookCarriesEveryConnection: a guest whose recorded address the
// host cannot reach (TEST-NET-1, as a guest on a TAP inside a network
// namespace is) is written and verified through Ledger.Dial alone; every
// connection goes through the hook, and the journal keeps the guest's own
// address.
func TestDialHookCarriesEveryConnection(t *testing.T) {
	r := newRig(t, "dialhook")
	ctx := r.ctx()
	v := r.boot(ctx)
	_, port, _ := net.SplitHostPort(r.guest.Addr)
	real := r.guest.Addr
	r.guest.Addr = net.JoinHostPort("192.0.2.10", port)
	var dials []string
	r.ledger.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials = append(dials, addr)
		if addr != r.guest.Addr {
			return nil, fmt.Errorf("dial hook: unexpected address %s", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, real)
	}
	if _, err := r.ledger.WriteMarkers(ctx, r.guest, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ledger.RecordBootID(ctx, r.guest); err != nil {
		t.Fatal(err)
	}
	r.wake(ctx, r.hibernate(ctx, v))
	verdict, err := r.ledger.Verify(ctx, r.guest, VerifyOpts{ExpectRAM: true})
	if err != nil {
		t.Fatal(err)
	}
	if !verdict.OK || verdict.Stable != 1 {
		t.Fatalf("verdict through the dial hook: %+v", verdict)
	}
	if len(dials) < 3 {
		t.Fatalf("dial hook saw %d connections (%v), want one per guest batch (>= 3)", len(dials), dials)
	}
	entries, _, err := ReadJournal(r.ledger.JournalPath())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Addr != "" && e.Addr != r.guest.Addr {
			t.Fatalf("journal entry %+v: address %s, want the guest's own %s", e, e.Addr, r.guest.Addr)
		}
	}
}
