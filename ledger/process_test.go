package ledger

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/stackbin"
)

// The test binary doubles as the helper processes these tests SIGKILL: a
// journal writer, and a runner writing a marker that a failpoint kills
// between two phases.
const helperEnv = "LEDGER_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		code := m.Run()
		stackbin.Cleanup() // binaries stackbin built for this run
		os.Exit(code)
	case "append":
		helperAppend()
	case "torn":
		helperTorn()
	case "write-marker":
		helperWriteMarker()
	default:
		fmt.Fprintln(os.Stderr, "unknown helper", os.Getenv(helperEnv))
	}
	os.Exit(2)
}

// helperAppend journals intents as fast as it can and confirms each one on
// stdout only after the append (and its fsync) returned.
func helperAppend() {
	l, err := openFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	for i := 0; ; i++ {
		m := fmt.Sprintf("m%07d", i)
		if err := l.append(Entry{Kind: KindIntent, Guest: "g1", Marker: m, Cycle: i}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return
		}
		fmt.Printf("ok %s\n", m)
	}
}

// openFromEnv opens the ledger the parent test named in LEDGER_KEYDIR,
// LEDGER_JOURNAL and LEDGER_PINS, as the helpers that journal need.
func openFromEnv() (*Ledger, error) {
	k, err := NewKey(os.Getenv("LEDGER_KEYDIR"))
	if err != nil {
		return nil, err
	}
	return Open(os.Getenv("LEDGER_JOURNAL"), k, os.Getenv("LEDGER_PINS"))
}

// helperTorn journals three entries, then leaves half a line in the file the
// way a writer killed inside write(2) does (the kernel stops a large write at
// a page boundary when SIGKILL is pending), and parks until it is killed.
func helperTorn() {
	p := os.Getenv("LEDGER_JOURNAL")
	for i := range 3 {
		if err := appendEntry(p, Entry{Kind: KindIntent, Guest: "g1", Marker: fmt.Sprintf("m%d", i)}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return
		}
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	if _, err := f.WriteString(goodAcked[:37]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	fmt.Println("parked")
	_, _ = io.Copy(io.Discard, os.Stdin) // until SIGKILL
}

// helperWriteMarker writes one marker into the guest named by the
// environment; VMCHAOS_FAILPOINTS decides where it dies.
func helperWriteMarker() {
	if err := failpoint.Init("vmchaos"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	l, err := openFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := l.WriteMarkers(ctx, Guest{Name: os.Getenv("LEDGER_GUEST"), Addr: os.Getenv("LEDGER_ADDR")}, 9)
	fmt.Fprintf(os.Stderr, "WriteMarkers returned %+v %v (the failpoint should have killed it)\n", m, err)
	os.Exit(3)
}

// helper is a started helper process, killed and reaped at cleanup.
type helper struct {
	cmd    *exec.Cmd
	stdout *bufio.Scanner
	stderr *strings.Builder
}

func startHelper(t *testing.T, mode string, env ...string) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+mode), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, stdout: bufio.NewScanner(out), stderr: &stderr}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Kill() // by the recorded pid; harmless if it already exited
		_ = cmd.Wait()
	})
	return h
}

// killAndReap SIGKILLs the helper and returns the stdout lines it had
// written before it died.
func (h *helper) killAndReap(t *testing.T) []string {
	t.Helper()
	if err := h.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var rest []string
	for h.stdout.Scan() {
		rest = append(rest, h.stdout.Text())
	}
	err := h.cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("helper did not die by SIGKILL: %v; stderr: %s", err, h.stderr)
	}
	return rest
}

// TestJournalSurvivesSIGKILLMidWrite kills a real process appending to the
// journal while it appends: every entry it confirmed is there, and the
// journal reads (and reopens) cleanly whatever the kill cut.
func TestJournalSurvivesSIGKILLMidWrite(t *testing.T) {
	dir := t.TempDir()
	journal := filepath.Join(dir, "ledger.jsonl")
	h := startHelper(t, "append", "LEDGER_JOURNAL="+journal, "LEDGER_KEYDIR="+dir, "LEDGER_PINS="+filepath.Join(dir, "pins"))
	var confirmed []string
	for len(confirmed) < 200 && h.stdout.Scan() {
		confirmed = append(confirmed, strings.TrimPrefix(h.stdout.Text(), "ok "))
	}
	if len(confirmed) < 200 {
		t.Fatalf("helper stopped after %d appends: %s", len(confirmed), h.stderr)
	}
	for _, ln := range h.killAndReap(t) {
		confirmed = append(confirmed, strings.TrimPrefix(ln, "ok "))
	}
	entries, torn, err := ReadJournal(journal)
	if err != nil {
		t.Fatalf("journal unreadable after SIGKILL: %v", err)
	}
	have := map[string]bool{}
	for _, e := range entries {
		have[e.Marker] = true
	}
	for _, m := range confirmed {
		if !have[m] {
			t.Fatalf("confirmed append %s missing from the journal (%d entries, torn=%v)", m, len(entries), torn)
		}
	}
	t.Logf("killed after %d confirmed appends; journal holds %d entries, torn tail: %v", len(confirmed), len(entries), torn)
	k, err := NewKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Open(journal, k, filepath.Join(dir, "pins"))
	if err != nil {
		t.Fatalf("reopen after SIGKILL: %v", err)
	}
	if err := l.append(Entry{Kind: KindBootID, Guest: "g1", BootID: "after"}); err != nil {
		t.Fatal(err)
	}
	after, torn, err := ReadJournal(journal)
	if err != nil || torn || after[len(after)-1].BootID != "after" {
		t.Fatalf("append after reopen: torn=%v err=%v", torn, err)
	}
}

// TestJournalTornLineFromKilledWriter: a writer SIGKILLed with half a line
// written leaves a torn tail; the reader reports it and keeps every whole
// line, and the next Open records the fragment and appends cleanly after it.
func TestJournalTornLineFromKilledWriter(t *testing.T) {
	dir := t.TempDir()
	journal := filepath.Join(dir, "ledger.jsonl")
	h := startHelper(t, "torn", "LEDGER_JOURNAL="+journal)
	if !h.stdout.Scan() || h.stdout.Text() != "parked" {
		t.Fatalf("helper did not park: %s", h.stderr)
	}
	h.killAndReap(t)
	entries, torn, err := ReadJournal(journal)
	if err != nil || !torn || len(entries) != 3 {
		t.Fatalf("read after kill: %d entries torn=%v err=%v", len(entries), torn, err)
	}
	k, err := NewKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Open(journal, k, filepath.Join(dir, "pins"))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.append(Entry{Kind: KindIntent, Guest: "g1", Marker: "m9"}); err != nil {
		t.Fatal(err)
	}
	entries, torn, err = ReadJournal(journal)
	if err != nil || torn || len(entries) != 5 {
		t.Fatalf("after reopen: %d entries torn=%v err=%v", len(entries), torn, err)
	}
	if entries[3].Kind != KindTornTail || entries[3].Note != goodAcked[:37] || entries[4].Marker != "m9" {
		t.Fatalf("entries: %+v", entries)
	}
}
