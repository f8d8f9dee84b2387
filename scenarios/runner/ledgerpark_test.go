package runner

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
)

// The ledger hook traces each phase of the harness's writer as process
// "vmchaos" with numbered datagrams, and parks at the case's point once:
// the .paused file names the harness's pid (the park's check against the
// hit), the release lets the write go on, a second write passes.
func TestLedgerHookTracesAndParksOnce(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "trace.sock")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	h := &ledgerHook{conn: conn, ctl: dir, pid: os.Getpid(), parks: map[string]string{"ledger.marker.written": "vm-a"}, done: map[string]bool{}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.hit(ctx, "ledger.marker.intent", failpoint.Attrs{"vm": "vm-a", "marker": "m1"}); err != nil {
		t.Fatalf("intent: %v", err)
	}
	if h.takeParked() {
		t.Fatal("parked before the point the case names")
	}
	done := make(chan error, 1)
	go func() { done <- h.hit(ctx, "ledger.marker.written", failpoint.Attrs{"vm": "vm-a", "marker": "m1"}) }()
	pid, err := failpoint.WaitParked(ctx, dir, "ledger.marker.written")
	if err != nil || pid != os.Getpid() {
		t.Fatalf("parked pid %d (%v), want %d", pid, err, os.Getpid())
	}
	select {
	case err := <-done:
		t.Fatalf("the write went on while parked (%v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := failpoint.Release(dir, "ledger.marker.written"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("released write: %v", err)
	}
	if !h.takeParked() || h.takeParked() {
		t.Fatal("takeParked: want true once after the park, then false")
	}
	// the next write's hit is traced, not parked again
	if err := h.hit(ctx, "ledger.marker.written", failpoint.Attrs{"vm": "vm-a", "marker": "m2"}); err != nil || h.takeParked() {
		t.Fatalf("second write: %v (or parked again)", err)
	}
	buf := make([]byte, 4096)
	for want := uint64(1); want <= 3; want++ {
		_ = l.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := l.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := failpoint.ParseEvent(buf[:n])
		if err != nil || ev.Proc != "vmchaos" || ev.Seq != want || ev.VM != "vm-a" || ev.Pid != os.Getpid() {
			t.Fatalf("datagram %d: %+v (%v)", want, ev, err)
		}
	}
}
