package ledger

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const (
	goodIntent = `{"time":"2026-01-02T03:04:05Z","kind":"intent","guest":"g1","marker":"g1.c1.x","cycle":1,"addr":"127.0.0.1:2222"}`
	goodAcked  = `{"time":"2026-01-02T03:04:06Z","kind":"acked","guest":"g1","marker":"g1.c1.x","cycle":1,"boot_id":"b1"}`
)

func writeJournal(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ledger.jsonl")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadJournalTornTail(t *testing.T) {
	cases := []struct {
		name    string
		content string
		entries int
		torn    bool
		corrupt bool
	}{
		{"empty", "", 0, false, false},
		{"whole lines", goodIntent + "\n" + goodAcked + "\n", 2, false, false},
		{"last line without newline", goodIntent + "\n" + goodAcked[:40], 1, true, false},
		{"complete object but no newline", goodIntent + "\n" + goodAcked, 1, true, false},
		{"garbage last line with newline", goodIntent + "\n" + "{\"kind\":\"ack\n", 1, true, false},
		{"blank lines tolerated", goodIntent + "\n\n" + goodAcked + "\n", 2, false, false},
		{"corrupt middle line", goodIntent + "\n" + "not json\n" + goodAcked + "\n", 0, false, true},
		{"unknown kind in the middle", `{"kind":"bogus"}` + "\n" + goodAcked + "\n", 0, false, true},
		{"acked without boot id in the middle", `{"kind":"acked","guest":"g","marker":"m"}` + "\n" + goodAcked + "\n", 0, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := writeJournal(t, c.content)
			entries, torn, err := ReadJournal(p)
			if c.corrupt {
				if !errors.Is(err, ErrCorruptJournal) {
					t.Fatalf("want ErrCorruptJournal, got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != c.entries || torn != c.torn {
				t.Fatalf("got %d entries torn=%v, want %d torn=%v", len(entries), torn, c.entries, c.torn)
			}
		})
	}
}

// TestReadJournalMissingFileIsAnError (issue #31): a missing journal is no
// journal, never an empty one, and every read failure (missing, unreadable,
// corrupt) is marked as the harness's own (ErrJournal). An empty file is an
// empty journal.
func TestReadJournalMissingFileIsAnError(t *testing.T) {
	dir := t.TempDir()
	corrupt := filepath.Join(dir, "corrupt.jsonl")
	if err := os.WriteFile(corrupt, []byte("{not json\n{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "none.jsonl"), dir, corrupt} {
		entries, _, err := ReadJournal(path)
		if !errors.Is(err, ErrJournal) || len(entries) != 0 {
			t.Errorf("%s: got %d entries, error %v; want ErrJournal", path, len(entries), err)
		}
	}
	emptyPath := filepath.Join(dir, "empty.jsonl")
	if err := os.WriteFile(emptyPath, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if entries, torn, err := ReadJournal(emptyPath); err != nil || torn || len(entries) != 0 {
		t.Fatalf("empty journal: %v %v %v", entries, torn, err)
	}
}

// TestOpenCutsTornTailAndKeepsEvidence: appending behind a fragment would
// glue two lines into one corrupt line in the middle of the journal, which
// the reader must then refuse; Open cuts it and records it instead.
func TestOpenCutsTornTailAndKeepsEvidence(t *testing.T) {
	frag := goodAcked[:50]
	p := writeJournal(t, goodIntent+"\n"+frag)
	k, err := NewKey(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l, err := Open(p, k, filepath.Join(t.TempDir(), "pins"))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.append(Entry{Kind: KindBootID, Guest: "g1", BootID: "b2"}); err != nil {
		t.Fatal(err)
	}
	entries, torn, err := ReadJournal(p)
	if err != nil || torn {
		t.Fatalf("after recovery: torn=%v err=%v", torn, err)
	}
	if len(entries) != 3 || entries[1].Kind != KindTornTail || entries[1].Note != frag || entries[2].Kind != KindBootID {
		t.Fatalf("entries after recovery: %+v", entries)
	}
	// A second Open finds nothing torn and adds nothing.
	if _, err := Open(p, k, filepath.Join(t.TempDir(), "pins")); err != nil {
		t.Fatal(err)
	}
	again, _, _ := ReadJournal(p)
	if len(again) != 3 {
		t.Fatalf("second Open changed the journal: %+v", again)
	}
}

func TestOpenRefusesCorruptJournal(t *testing.T) {
	p := writeJournal(t, "garbage\n"+goodIntent+"\n")
	k, err := NewKey(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(p, k, filepath.Join(t.TempDir(), "pins")); !errors.Is(err, ErrCorruptJournal) {
		t.Fatalf("want ErrCorruptJournal, got %v", err)
	}
}

func TestNewKeyReusesTheRunKey(t *testing.T) {
	dir := t.TempDir()
	k1, err := NewKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := NewKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if k1.AuthorizedKey() != k2.AuthorizedKey() {
		t.Fatal("a second NewKey in the same dir made a different key")
	}
	if !strings.HasPrefix(k1.AuthorizedKey(), "ssh-ed25519 ") {
		t.Fatalf("authorized key %q", k1.AuthorizedKey())
	}
	pub, err := os.ReadFile(filepath.Join(dir, "id_ed25519.pub"))
	if err != nil || strings.TrimSpace(string(pub)) != k1.AuthorizedKey() {
		t.Fatalf("pub file %q err %v", pub, err)
	}
	fi, err := os.Stat(k1.PrivatePath())
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("private key %v mode %v", err, fi)
	}
}

func FuzzParseEntry(f *testing.F) {
	for _, s := range []string{
		goodIntent, goodAcked,
		`{"kind":"boot-id","guest":"g1","boot_id":"b"}`,
		`{"kind":"torn-tail","note":"{\"ki"}`,
		`{"kind":"intent","guest":"g 1","marker":"m"}`,
		`{"kind":"intent","guest":"g1","marker":"../../etc/passwd"}`,
		`{"kind":"acked"} {}`,
		`[]`, `null`, ``, `{`,
		wlStart, wlAcks,
		`{"kind":"wl-acks","guest":"g1","acks":[{"seq":0,"begin_ns":1,"ack_ns":2}]}`,
		`{"kind":"wl-acks","guest":"g1","acks":[{"seq":1,"begin_ns":5,"ack_ns":2}]}`,
		`{"kind":"wl-start","guest":"g1","seq":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := ParseEntry(b)
		if err != nil {
			return
		}
		// Whatever parses must be safe to act on: names that reach a
		// guest command line are plain.
		if e.Kind == KindIntent || e.Kind == KindAcked {
			if checkMarkerName(e.Marker) != nil || checkGuestName(e.Guest) != nil {
				t.Fatalf("accepted unsafe names: %+v", e)
			}
		}
		if bytes.ContainsAny(b, "\n\r") {
			return // JSON whitespace may hold newlines; a journal line cannot
		}
		// And a journal made of it reads back the same entry.
		entries, torn, _, err := parseJournal(append(append([]byte{}, b...), '\n'))
		if err != nil || torn || len(entries) != 1 || entries[0].Kind != e.Kind || entries[0].Marker != e.Marker {
			t.Fatalf("journal of one parsed line: %+v torn=%v err=%v", entries, torn, err)
		}
	})
}

func FuzzReadJournal(f *testing.F) {
	f.Add([]byte(goodIntent + "\n" + goodAcked + "\n"))
	f.Add([]byte(goodIntent + "\n" + goodAcked[:30]))
	f.Add([]byte("x\n" + goodIntent + "\n"))
	f.Add([]byte(wlStart + "\n" + wlAcks + "\n" + wlAcks[:40]))
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, torn, good, err := parseJournal(b)
		if err != nil {
			return
		}
		if good > len(b) || (!torn && good != len(b)) {
			t.Fatalf("good prefix %d of %d, torn=%v", good, len(b), torn)
		}
		// The good prefix alone is a whole journal with the same entries.
		again, torn2, _, err := parseJournal(b[:good])
		if err != nil || torn2 || len(again) != len(entries) {
			t.Fatalf("prefix reparse: %d vs %d entries, torn=%v err=%v", len(again), len(entries), torn2, err)
		}
	})
}

// TestOpenWaitsForAnAppendInProgress: a line another process is appending
// looks torn until its write completes; Open's recovery must wait for the
// writer instead of cutting a live line.
func TestOpenWaitsForAnAppendInProgress(t *testing.T) {
	p := writeJournal(t, goodIntent+"\n")
	k, err := NewKey(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	half, finish, wrote := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		wrote <- withJournalLock(p, unix.LOCK_SH, func() error {
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				close(half)
				return err
			}
			defer f.Close()
			_, _ = f.WriteString(goodAcked[:20])
			close(half)
			<-finish
			_, err = f.WriteString(goodAcked[20:] + "\n")
			return err
		})
	}()
	<-half
	opened := make(chan error, 1)
	go func() {
		_, err := Open(p, k, filepath.Join(t.TempDir(), "pins"))
		opened <- err
	}()
	// Give a lock-less Open every chance to cut the half line; with the
	// lock it is parked until the writer finishes.
	time.Sleep(100 * time.Millisecond)
	close(finish)
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if err := <-opened; err != nil {
		t.Fatal(err)
	}
	entries, torn, err := ReadJournal(p)
	if err != nil || torn || len(entries) != 2 || entries[1].Kind != KindAcked {
		t.Fatalf("entries %+v torn=%v err=%v", entries, torn, err)
	}
}

// Workload journal lines (issue #13).
const (
	wlStart = `{"time":"2026-12-01T00:00:00Z","kind":"wl-start","guest":"g1","seq":1,"boot_id":"b1","host_ns":10}`
	wlAcks  = `{"time":"2026-12-01T00:00:00Z","kind":"wl-acks","guest":"g1","acks":[{"seq":1,"begin_ns":100,"ack_ns":150,"host_ns":170},{"seq":2,"begin_ns":200,"ack_ns":250,"host_ns":270}],"host_ns":300}`
)

// TestWorkloadEntriesRoundTrip: wl-* lines parse, bad acks are refused, and
// the history of a guest comes back from them (a forget starts it over).
func TestWorkloadEntriesRoundTrip(t *testing.T) {
	j := wlStart + "\n" + wlAcks + "\n" + `{"kind":"wl-acks","guest":"g2","acks":[{"seq":1,"begin_ns":1,"ack_ns":1}]}` + "\n" + wlAcks[:50]
	entries, torn, _, err := parseJournal([]byte(j))
	if err != nil || !torn || len(entries) != 3 {
		t.Fatalf("entries %d torn %v err %v", len(entries), torn, err)
	}
	h := WorkloadFromJournal(entries, "g1")
	if h.First != 1 || h.Sessions != 1 || len(h.Acks) != 2 || h.Acks[1].AckNs != 250 || h.BootIDs[0] != "b1" {
		t.Fatalf("history %+v", h)
	}
	entries = append(entries, Entry{Kind: KindForget, Guest: "g1"})
	if h := WorkloadFromJournal(entries, "g1"); h.Sessions != 0 || len(h.Acks) != 0 {
		t.Fatalf("after forget: %+v", h)
	}
	for _, bad := range []string{`{"kind":"wl-acks","guest":"g1"}`, `{"kind":"wl-start","guest":"g1","seq":1}`,
		`{"kind":"wl-acks","guest":"g1","acks":[{"seq":1,"begin_ns":5,"ack_ns":2}]}`, `{"kind":"wl-end","guest":"a b"}`} {
		if _, err := ParseEntry([]byte(bad)); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
}
