// Package ledger is the guest marker-file ledger: before each hibernate (and
// wherever a scenario chooses) it writes a uniquely named marker into the
// guest over SSH — a disk marker followed by sync, and a RAM marker — and
// after each wake it lists the guest and classifies every marker the host
// journal knows about. The journal (JSONL, append + fsync) records intent
// before the guest is touched and acked only after the guest confirmed, so a
// runner killed at any instruction leaves a journal whose every claim is true.
//
// The same code runs against fake guests (fakech) and real ones: it uses only
// mkdir -p, touch, sync, ls -1, cat and rm.
package ledger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
)

// Guest paths. Disk markers must survive anything short of losing the disk;
// RAM markers survive only a memory restore, which is what tells a wake that
// restored the hibernate snapshot from one that booted fresh from the disk.
const (
	DiskDir    = "/var/lib/vmchaos/ledger"
	RAMDir     = "/run/vmchaos"
	BootIDPath = "/proc/sys/kernel/random/boot_id"
)

// DefaultUser is the guest account the ledger logs in as. It must be root
// (or root-equivalent): the markers live under /var/lib and /run. realch's
// cloud-init seed authorizes the run's key for root (disable_root: false);
// the fake guest accepts the run's key for any user.
const DefaultUser = "root"

// Guest is one VM as the ledger reaches it.
type Guest struct {
	Name string // VM name: stable across hibernate and wake, the key of the journal and the host key pin
	Addr string // "ip:port" of its SSH server (vmctl.NIC.Address())
}

// Marker is one acknowledged marker.
type Marker struct {
	Name     string
	Guest    string
	Cycle    int
	DiskPath string
	RAMPath  string
	BootID   string // boot id the RAM marker was written under
}

// Ledger writes and verifies the markers of one run.
type Ledger struct {
	// User is the guest login (DefaultUser unless changed before use).
	User string
	// AttemptTimeout bounds one SSH attempt (DefaultAttemptTimeout).
	AttemptTimeout time.Duration
	// Dial opens the TCP connection to a guest's SSH address; nil means a
	// plain net.Dialer. A runner whose guests sit on TAP devices inside a
	// network namespace sets it to realch's Netns.DialContext, since the
	// host namespace has no route to them. Set it before first use.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)

	// Hook, when set, runs at each of the writer's named phases
	// (ledger.marker.intent, ledger.marker.written) after failpoint.Hit:
	// the harness traces its own writer there and parks it for a fault
	// (runner/ledgerpark.go). A non-nil error ends the write as the
	// phase's failure. Set it before the writes it should see.
	Hook func(ctx context.Context, point string, attrs failpoint.Attrs) error

	journal string
	key     *Key
	pins    pinFile
	mu      sync.Mutex // serialises journal appends of this process
}

// Open returns the ledger of a run: journalPath is the JSONL journal in the
// run's result dir (created if missing), key the run's SSH key, pins the
// known-hosts file where guest host keys are pinned at first contact. A torn
// last line left by a runner killed mid-append is cut off and recorded as a
// torn-tail entry, so later appends start on a fresh line.
func Open(journalPath string, key *Key, pins string) (*Ledger, error) {
	if key == nil {
		return nil, errors.New("ledger: no SSH key")
	}
	if journalPath == "" || pins == "" {
		return nil, errors.New("ledger: journal and pins paths are required")
	}
	if err := os.MkdirAll(filepath.Dir(journalPath), 0o755); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	if _, err := recoverTornTail(journalPath); err != nil {
		return nil, fmt.Errorf("ledger: open: %w", err)
	}
	return &Ledger{
		User:           DefaultUser,
		AttemptTimeout: DefaultAttemptTimeout,
		journal:        journalPath,
		key:            key,
		pins:           pinFile{path: pins},
	}, nil
}

// JournalPath is where the journal lives.
func (l *Ledger) JournalPath() string { return l.journal }

func (l *Ledger) append(e Entry) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	e.Time = time.Now().UTC()
	return appendEntry(l.journal, e)
}

// WriteMarkers writes one new marker into g: intent is journaled (fsynced)
// first, then the guest creates the disk marker, syncs, creates the RAM
// marker and reports its boot id, and only then is acked journaled. A failure
// anywhere after the intent leaves the marker in-flight, which the verdict
// accepts either way: the write may or may not have reached the guest.
func (l *Ledger) WriteMarkers(ctx context.Context, g Guest, cycle int) (Marker, error) {
	if err := checkGuest(g); err != nil {
		return Marker{}, err
	}
	name, err := newMarkerName(g.Name, cycle)
	if err != nil {
		return Marker{}, err
	}
	m := Marker{Name: name, Guest: g.Name, Cycle: cycle, DiskPath: DiskDir + "/" + name, RAMPath: RAMDir + "/" + name}
	if err := l.append(Entry{Kind: KindIntent, Guest: g.Name, Marker: name, Cycle: cycle, Addr: g.Addr}); err != nil {
		return Marker{}, fmt.Errorf("ledger %s: marker %s: %w", g.Name, name, err)
	}
	attrs := failpoint.Attrs{"vm": g.Name, "marker": name}
	if err := l.hit(ctx, "ledger.marker.intent", attrs); err != nil {
		return Marker{}, fmt.Errorf("ledger %s: marker %s: %w", g.Name, name, err)
	}
	// The disk marker is synced before the RAM marker exists, so a RAM
	// marker present always implies its disk marker was made durable.
	cmd := "mkdir -p " + DiskDir + " && touch " + m.DiskPath + " && sync && mkdir -p " + RAMDir +
		" && touch " + m.RAMPath + " && cat " + BootIDPath
	out, err := l.exec(ctx, g, cmd)
	if err != nil {
		return Marker{}, fmt.Errorf("ledger %s: write marker %s: %w", g.Name, name, err)
	}
	m.BootID = strings.TrimSpace(out[0])
	if m.BootID == "" {
		return Marker{}, fmt.Errorf("ledger %s: write marker %s: guest reported an empty boot id", g.Name, name)
	}
	if err := l.hit(ctx, "ledger.marker.written", attrs); err != nil {
		return Marker{}, fmt.Errorf("ledger %s: marker %s: %w", g.Name, name, err)
	}
	if err := l.append(Entry{Kind: KindAcked, Guest: g.Name, Marker: name, Cycle: cycle, Addr: g.Addr, BootID: m.BootID}); err != nil {
		return Marker{}, fmt.Errorf("ledger %s: marker %s: %w", g.Name, name, err)
	}
	return m, nil
}

// hit marks one of the writer's phases: failpoint.Hit, then the Hook.
func (l *Ledger) hit(ctx context.Context, point string, attrs failpoint.Attrs) error {
	if err := failpoint.Hit(ctx, point, attrs); err != nil {
		return err
	}
	if l.Hook != nil {
		return l.Hook(ctx, point, attrs)
	}
	return nil
}

// RecordBootID journals g's current boot id: the baseline the next wake's
// boot id and RAM markers are compared against. Call it right before a
// hibernate.
func (l *Ledger) RecordBootID(ctx context.Context, g Guest) (string, error) {
	out, err := l.exec(ctx, g, "cat "+BootIDPath)
	if err != nil {
		return "", fmt.Errorf("ledger %s: boot id: %w", g.Name, err)
	}
	id := strings.TrimSpace(out[0])
	if id == "" {
		return "", fmt.Errorf("ledger %s: guest reported an empty boot id", g.Name)
	}
	if err := l.append(Entry{Kind: KindBootID, Guest: g.Name, Addr: g.Addr, BootID: id}); err != nil {
		return "", fmt.Errorf("ledger %s: %w", g.Name, err)
	}
	return id, nil
}

// Forget retires guest: its journaled markers and boot id baseline no longer
// bind the name, and its host key pin is dropped. Call it when a scenario
// deletes a VM on purpose and may create a new machine under the same name;
// never to make a failing verdict pass.
func (l *Ledger) Forget(guest, reason string) error {
	if err := checkGuestName(guest); err != nil {
		return fmt.Errorf("ledger: forget: %w", err)
	}
	if err := l.append(Entry{Kind: KindForget, Guest: guest, Note: reason}); err != nil {
		return fmt.Errorf("ledger %s: forget: %w", guest, err)
	}
	if err := l.pins.drop(guest); err != nil {
		return fmt.Errorf("ledger %s: forget: %w", guest, err)
	}
	return nil
}

// VerifyOpts selects what Verify checks.
type VerifyOpts struct {
	// ExpectRAM: the guest just came back from a hibernate/wake cycle, so
	// its memory must have been restored: the boot id must equal the
	// journaled baseline and every RAM marker acked under that boot id
	// must still exist.
	ExpectRAM bool
	// ColdBootAllowed, when not empty, says why a fresh boot between the
	// baseline and now is legitimate (e.g. "VMM SIGKILLed before the save;
	// vm start booted it"): a changed boot id and the RAM markers it took
	// are then reported, with this reason, but do not fail the verdict. RAM
	// markers missing under an unchanged boot id still fail.
	ColdBootAllowed string
}

// Verify lists g's ledger and classifies every journaled marker of g (see
// Classify). The verdict is computed from the journal on disk, so it is
// right even for markers written by an earlier, crashed runner process.
func (l *Ledger) Verify(ctx context.Context, g Guest, opts VerifyOpts) (Verdict, error) {
	entries, _, err := ReadJournal(l.journal)
	if err != nil {
		return Verdict{}, fmt.Errorf("ledger %s: verify: %w", g.Name, err)
	}
	cmds := []string{"mkdir -p " + DiskDir + " && ls -1 " + DiskDir}
	if opts.ExpectRAM {
		cmds = append(cmds, "mkdir -p "+RAMDir+" && ls -1 "+RAMDir, "cat "+BootIDPath)
	}
	out, err := l.exec(ctx, g, cmds...)
	if err != nil {
		return Verdict{}, fmt.Errorf("ledger %s: verify: %w", g.Name, err)
	}
	obs := Observed{Disk: listing(out[0])}
	if opts.ExpectRAM {
		obs.RAM = listing(out[1])
		obs.BootID = strings.TrimSpace(out[2])
		obs.CheckRAM = true
		obs.ColdBootAllowed = opts.ColdBootAllowed
	}
	return Classify(g.Name, entries, obs), nil
}

// Exec runs one command in g over the ledger's pinned SSH connection and
// returns its stdout. Scenarios and tests use it to act on a guest the way
// the ledger reaches it (the command must be idempotent: it is retried on
// connection failures).
func (l *Ledger) Exec(ctx context.Context, g Guest, cmd string) (string, error) {
	out, err := l.exec(ctx, g, cmd)
	if err != nil {
		return "", err
	}
	return out[0], nil
}

// listing parses `ls -1` output.
func listing(s string) []string {
	var names []string
	for _, ln := range strings.Split(s, "\n") {
		ln = strings.TrimSpace(ln)
		if ln != "" {
			names = append(names, strings.TrimSuffix(ln, "/"))
		}
	}
	return names
}

var (
	guestNameRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	markerNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$`)
	unsafeRE     = regexp.MustCompile(`[^A-Za-z0-9_-]+`)
)

// checkGuestName keeps guest names usable as journal keys and pin hosts.
func checkGuestName(n string) error {
	if !guestNameRE.MatchString(n) {
		return fmt.Errorf("guest name %q: want [A-Za-z0-9][A-Za-z0-9._-]* up to 128 chars", n)
	}
	return nil
}

// checkMarkerName keeps marker names safe to put on a guest command line.
func checkMarkerName(n string) error {
	if !markerNameRE.MatchString(n) {
		return fmt.Errorf("marker name %q: want [A-Za-z0-9][A-Za-z0-9._-]* up to 200 chars", n)
	}
	return nil
}

func checkGuest(g Guest) error {
	if err := checkGuestName(g.Name); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	if g.Addr == "" {
		return fmt.Errorf("ledger: guest %s has no address", g.Name)
	}
	return nil
}

// newMarkerName makes a name unique across runs and guests: the guest and
// cycle for a human reading the guest's directory, the host clock and 64
// random bits so two runners never collide.
func newMarkerName(guest string, cycle int) (string, error) {
	var rb [8]byte
	if _, err := rand.Read(rb[:]); err != nil {
		return "", fmt.Errorf("ledger: marker name: %w", err)
	}
	g := unsafeRE.ReplaceAllString(guest, "_")
	if len(g) > 64 {
		g = g[:64]
	}
	return fmt.Sprintf("%s.c%d.%s.%s", g, cycle, time.Now().UTC().Format("20060102T150405"), hex.EncodeToString(rb[:])), nil
}
