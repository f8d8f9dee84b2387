package stack

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
)

func listenTrace(t *testing.T) (*injector.Trace, string) {
	t.Helper()
	dir := t.TempDir()
	tr, err := injector.ListenTrace(filepath.Join(dir, "trace.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	ctl := filepath.Join(dir, "ctl")
	if err := os.Mkdir(ctl, 0o755); err != nil {
		t.Fatal(err)
	}
	return tr, ctl
}

// TestTraceAccountingNamesAProcessWhoseDialFailed: a process started with
// VMCHAOS_TRACE set whose dial of the socket fails sends nothing; it says so
// in the control dir and the teardown check fails the case naming it.
func TestTraceAccountingNamesAProcessWhoseDialFailed(t *testing.T) {
	tr, ctl := listenTrace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := TraceAccounting(ctx, tr, ctl); err != nil {
		t.Fatalf("nothing ran yet: %v", err)
	}
	gone := filepath.Join(t.TempDir(), "no-such.sock")
	if err := failpoint.Configure("vmctl", gone, "", ctl); err != nil {
		t.Fatal(err)
	}
	defer failpoint.Reset()
	_ = failpoint.Hit(ctx, "vm.create.reserved", nil) // dropped: nothing to send to
	err := TraceAccounting(ctx, tr, ctl)
	want := fmt.Sprintf("vmctl pid %d could not dial the trace socket %s", os.Getpid(), gone)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("TraceAccounting = %v, want it to name %q", err, want)
	}
}

// TestTraceAccountingFindsALostTail: a process that exits cleanly writes its
// trace end; the teardown check holds it against the trace. A stream that
// arrived whole (read without waiting: Drain) is accounted for; one whose
// last datagram a relay dropped — the loss no gap can show — is not, and the
// error names the process and the datagram.
func TestTraceAccountingFindsALostTail(t *testing.T) {
	tr, ctl := listenTrace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer failpoint.Reset()

	if err := failpoint.Configure("vmctl", tr.Path(), "", ctl); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "b", "c"} {
		_ = failpoint.Hit(ctx, p, nil)
	}
	failpoint.Close()
	if err := TraceAccounting(ctx, tr, ctl); err != nil {
		t.Fatalf("a whole stream: %v", err)
	}

	// The same process again (a new incarnation under its pid), through a
	// relay that drops the last of three datagrams.
	relay, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "relay.sock"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	out, err := net.Dial("unixgram", tr.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	relayed := make(chan error, 1)
	go func() {
		buf := make([]byte, 1<<16)
		for i := 1; i <= 3; i++ {
			n, err := relay.Read(buf)
			if err == nil && i < 3 {
				_, err = out.Write(buf[:n])
			}
			if err != nil {
				relayed <- err
				return
			}
		}
		relayed <- nil
	}()
	if err := failpoint.Configure("vmctl", relay.LocalAddr().String(), "", ctl); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"d", "e", "f"} {
		_ = failpoint.Hit(ctx, p, nil)
	}
	failpoint.Close()
	if err := <-relayed; err != nil {
		t.Fatal(err)
	}
	if lost := tr.Lost(); len(lost) != 0 {
		t.Fatalf("a tail loss shows no gap, yet Lost() = %v", lost)
	}
	err = TraceAccounting(ctx, tr, ctl)
	want := fmt.Sprintf("tail of the stream lost: vmctl pid %d: datagram #3 lost", os.Getpid())
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("TraceAccounting = %v, want %q", err, want)
	}
}
