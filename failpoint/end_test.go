package failpoint

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestCloseWritesTheTraceEnd: a clean exit leaves its trace end in the
// control dir — proc, pid, the stamp of its datagram #1 (which tells
// incarnations under one pid apart) and the number of its last datagram —
// and nothing leaves after it.
func TestCloseWritesTheTraceEnd(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "t.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctl := filepath.Join(dir, "ctl")
	if err := os.Mkdir(ctl, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Configure("vmctl", sock, "", ctl); err != nil {
		t.Fatal(err)
	}
	defer Reset()
	for _, p := range []string{"a", "b"} {
		if err := Hit(context.Background(), p, nil); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 1<<16)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	first, err := ParseEvent(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	Close()
	if Enabled() || Hit(context.Background(), "c", nil) != nil {
		t.Fatal("hits still enabled after Close")
	}
	ends, fails, err := ReadTraceReports(ctl)
	if err != nil || len(fails) != 0 {
		t.Fatalf("reports: %v %v", fails, err)
	}
	want := TraceEnd{Proc: "vmctl", Pid: os.Getpid(), FirstTsNs: first.TsNs, LastSeq: 2}
	if len(ends) != 1 || ends[0] != want {
		t.Fatalf("trace ends %+v, want %+v", ends, want)
	}
}

// TestReadTraceReportsRefusesAnUnreadableReport: a report it cannot decode
// is an error, never skipped: the accounting it carries would be lost.
func TestReadTraceReportsRefusesAnUnreadableReport(t *testing.T) {
	ctl := t.TempDir()
	if err := os.WriteFile(filepath.Join(ctl, TraceEndPrefix+"vmctl.1.2.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadTraceReports(ctl); err == nil {
		t.Fatal("a torn trace end was read without an error")
	}
	if _, _, err := ReadTraceReports(filepath.Join(ctl, "gone")); err == nil {
		t.Fatal("a missing control dir was read without an error")
	}
}
