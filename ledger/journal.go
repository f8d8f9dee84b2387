package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/durable"
	"golang.org/x/sys/unix"
)

// Journal entry kinds.
const (
	// KindIntent is written (fsynced) before the ledger touches the guest, so
	// a marker found in the guest is never a surprise to a journal that
	// survived a crash.
	KindIntent = "intent"
	// KindAcked is written only after the guest confirmed the disk marker,
	// its sync and the RAM marker; it carries the boot id the RAM marker was
	// written under.
	KindAcked = "acked"
	// KindBootID records the guest's boot id before a hibernate: the
	// baseline a wake is compared against.
	KindBootID = "boot-id"
	// KindForget retires every earlier marker and the boot id baseline of a
	// guest: the VM was deleted on purpose and the name may come back as a
	// new machine, which must not be held to the old one's markers.
	KindForget = "forget"
	// KindTornTail records the fragment of a torn last line that Open cut
	// off, so the evidence of a crash mid-append stays in the journal.
	KindTornTail = "torn-tail"
	// KindWorkloadStart: a guest writer session started at Seq under BootID
	// (issue #13); Note holds its options.
	KindWorkloadStart = "wl-start"
	// KindWorkloadAcks: acks the guest writer streamed, journaled in
	// batches as they arrive.
	KindWorkloadAcks = "wl-acks"
	// KindWorkloadEnd: a writer session ended; Note says how.
	KindWorkloadEnd = "wl-end"
)

// Entry is one JSONL line of the host journal.
type Entry struct {
	Time   time.Time `json:"time"`
	Kind   string    `json:"kind"`
	Guest  string    `json:"guest,omitempty"`
	Marker string    `json:"marker,omitempty"`
	Cycle  int       `json:"cycle,omitempty"`
	Addr   string    `json:"addr,omitempty"`
	BootID string    `json:"boot_id,omitempty"`
	Note   string    `json:"note,omitempty"`
	// Workload entries (wl-*): the first seq of a session, the acks, and
	// the harness's CLOCK_MONOTONIC when the entry was made.
	Seq    int           `json:"seq,omitempty"`
	Acks   []WorkloadAck `json:"acks,omitempty"`
	HostNs int64         `json:"host_ns,omitempty"`
}

// ErrCorruptJournal means a line other than the last one does not parse: that
// is not a crash artefact (appends are sequential and fsynced), so the journal
// cannot be trusted and the reader refuses it.
var ErrCorruptJournal = errors.New("ledger journal corrupt")

// ParseEntry decodes and validates one journal line (without its newline).
func ParseEntry(line []byte) (Entry, error) {
	var e Entry
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&e); err != nil {
		return Entry{}, fmt.Errorf("journal line: %w", err)
	}
	if dec.More() {
		return Entry{}, errors.New("journal line: trailing data after the JSON object")
	}
	if err := e.validate(); err != nil {
		return Entry{}, fmt.Errorf("journal line: %w", err)
	}
	return e, nil
}

func (e Entry) validate() error {
	switch e.Kind {
	case KindIntent, KindAcked:
		if err := checkGuestName(e.Guest); err != nil {
			return err
		}
		if err := checkMarkerName(e.Marker); err != nil {
			return err
		}
		if e.Kind == KindAcked && e.BootID == "" {
			return fmt.Errorf("acked %s without a boot id", e.Marker)
		}
	case KindBootID:
		if err := checkGuestName(e.Guest); err != nil {
			return err
		}
		if e.BootID == "" {
			return errors.New("boot-id entry without a boot id")
		}
	case KindForget:
		if err := checkGuestName(e.Guest); err != nil {
			return err
		}
	case KindTornTail:
	case KindWorkloadStart, KindWorkloadAcks, KindWorkloadEnd:
		if err := checkGuestName(e.Guest); err != nil {
			return err
		}
		if e.Kind == KindWorkloadStart && (e.Seq < 1 || e.BootID == "") {
			return errors.New("wl-start without a first seq or a boot id")
		}
		if e.Kind == KindWorkloadAcks && len(e.Acks) == 0 {
			return errors.New("wl-acks without acks")
		}
		for _, a := range e.Acks {
			if a.Seq < 1 || a.BeginNs <= 0 || a.AckNs < a.BeginNs {
				return fmt.Errorf("wl-acks: bad ack %+v", a)
			}
		}
	default:
		return fmt.Errorf("unknown kind %q", e.Kind)
	}
	return nil
}

// ErrJournal marks every failure to read the journal: the harness's own
// record, so a verdict that needed it proves nothing either way (a harness
// error, not the product's fail).
var ErrJournal = errors.New("ledger journal unreadable")

// ReadJournal reads every entry of the journal at path. A missing file is an
// error, never an empty journal: Open creates it, so a journal that is gone
// lost every claim it held (issue #31). A last line that is incomplete (no
// newline) or does not parse is what a writer killed mid-append leaves: it is
// skipped and reported with torn=true. Any earlier bad line is
// ErrCorruptJournal. Every error wraps ErrJournal.
func ReadJournal(path string) (entries []Entry, torn bool, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, false, fmt.Errorf("%w: read %s: %w", ErrJournal, path, err)
	}
	entries, torn, _, err = parseJournal(b)
	if err != nil {
		return nil, false, fmt.Errorf("%w: %s: %w", ErrJournal, path, err)
	}
	return entries, torn, nil
}

// parseJournal returns the entries, whether the tail is torn, and the length
// of the prefix that holds only whole, valid lines.
func parseJournal(b []byte) (entries []Entry, torn bool, good int, err error) {
	lineNo := 0
	for off := 0; off < len(b); {
		lineNo++
		nl := bytes.IndexByte(b[off:], '\n')
		if nl < 0 {
			// No newline: the append that wrote it never returned, so
			// nobody relied on it.
			return entries, true, off, nil
		}
		line := b[off : off+nl]
		next := off + nl + 1
		if len(bytes.TrimSpace(line)) == 0 {
			off = next
			good = off
			continue
		}
		e, perr := ParseEntry(line)
		if perr != nil {
			if next == len(b) {
				return entries, true, off, nil
			}
			return nil, false, 0, fmt.Errorf("%w: line %d: %v", ErrCorruptJournal, lineNo, perr)
		}
		entries = append(entries, e)
		off = next
		good = off
	}
	return entries, false, good, nil
}

// recoverTornTail cuts a torn last line off the journal at path and records
// the fragment as a torn-tail entry, so the next append starts on a fresh line
// (appending behind a fragment would glue two lines into one corrupt line in
// the middle of the file). It returns the fragment, empty when nothing was torn.
// It holds the journal's lock exclusively: a line another process is
// appending right now looks torn until its write completes.
func recoverTornTail(path string) (frag string, err error) {
	err = withJournalLock(path, unix.LOCK_EX, func() error {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("ledger journal %s: %w", path, err)
		}
		_, torn, good, err := parseJournal(b)
		if err != nil {
			return fmt.Errorf("ledger journal %s: %w", path, err)
		}
		if !torn {
			return nil
		}
		frag = strings.TrimRight(string(b[good:]), "\n")
		if err := os.Truncate(path, int64(good)); err != nil {
			return fmt.Errorf("ledger journal %s: cut torn tail: %w", path, err)
		}
		return appendLocked(path, Entry{Time: time.Now().UTC(), Kind: KindTornTail, Note: frag})
	})
	return frag, err
}

// appendEntry appends one entry under the journal's shared lock, so any
// number of writers append side by side (O_APPEND keeps their lines whole)
// while a recovering Open waits for them.
func appendEntry(path string, e Entry) error {
	return withJournalLock(path, unix.LOCK_SH, func() error { return appendLocked(path, e) })
}

func appendLocked(path string, e Entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("ledger journal: encode %s entry: %w", e.Kind, err)
	}
	if err := durable.AppendLine(path, b); err != nil {
		return fmt.Errorf("ledger journal: %w", err)
	}
	return nil
}

// withJournalLock runs fn holding a flock on the journal (created if
// missing). The journal is only ever appended to or truncated in place,
// never replaced, so the lock is always on the live inode.
func withJournalLock(path string, how int, fn func() error) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("ledger journal: %w", err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		return fmt.Errorf("ledger journal %s: lock: %w", path, err)
	}
	return fn()
}
