package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
)

// The harness's own guest writer as a park target (the ledger's cells of
// the coverage map, op context "ledger"): ledger.WriteMarkers marks
// ledger.marker.intent (the intent journaled, the guest not written yet)
// and ledger.marker.written (the guest confirmed its disk marker, sync and
// RAM marker; the ack not journaled yet). The harness runs the writes of
// every case in one process, so it cannot take a VMCHAOS_FAILPOINTS of its
// own: the case's ledger gets a hook instead (ledger.Ledger.Hook) that
// sends the phase to the case's trace as process "vmchaos" and parks the
// write there, through the stack's control dir, the first time the case's
// park trigger names the point. The runner's park then finds it like any
// parked process (the trace's hit, the .paused file with the harness's
// pid), injects the fault and releases it.

// ledgerPointPrefix is the ledger's phases' common prefix.
const ledgerPointPrefix = "ledger."

// armLedgerPark hooks the case's ledger when a park trigger of the case's
// own stack names a ledger point; the setup's writes ran before it, so the
// act's write is the one parked. The hook's datagrams are numbered like a
// process's (trace loss shows as a gap).
func (cr *caseRun) armLedgerPark() error {
	parks := map[string]string{} // point → the VM it parks for ("" any)
	for i, f := range cr.s.Faults {
		trig := cr.r.triggerString(cr.c, i)
		if f.Node != "" || !strings.HasPrefix(trig, "park "+ledgerPointPrefix) {
			continue
		}
		t, err := injector.ParseTrigger(trig)
		if err != nil {
			return harnessErr(fmt.Errorf("fault %d: %w", i, err))
		}
		if t.N > 1 {
			return harnessErr(fmt.Errorf("fault %d: %s: the ledger's writer parks at its first hit only", i, trig))
		}
		parks[t.Point] = t.VM
	}
	if len(parks) == 0 {
		return nil
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: cr.st.Trace.Path(), Net: "unixgram"})
	if err != nil {
		return harnessErr(fmt.Errorf("ledger park: trace socket: %w", err))
	}
	h := &ledgerHook{conn: conn, ctl: cr.st.CtlDir, parks: parks, done: map[string]bool{}, pid: os.Getpid()}
	cr.ledgerHook = h
	cr.st.Ledger.Hook = h.hit
	return nil
}

// takeParked reports whether the write that just returned was parked (the
// fault's), and forgets it: the next write is judged on its own.
func (h *ledgerHook) takeParked() bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.parked
	h.parked = false
	return p
}

// ledgerHook is the hook of one case's ledger.
type ledgerHook struct {
	conn  *net.UnixConn
	ctl   string
	pid   int
	mu    sync.Mutex
	seq   uint64
	parks map[string]string
	done  map[string]bool // points parked once already
	// parked: the write in flight was parked (taken by its step)
	parked bool
}

// hit sends the phase to the case's trace, then parks there when the case
// asks (once per point).
func (h *ledgerHook) hit(ctx context.Context, point string, attrs failpoint.Attrs) error {
	vm, _ := attrs["vm"].(string)
	h.mu.Lock()
	h.seq++
	ev := failpoint.Event{Seq: h.seq, Pid: h.pid, Proc: "vmchaos", Point: point, VM: vm, Attrs: map[string]any{}}
	for k, v := range attrs {
		if k != "vm" {
			ev.Attrs[k] = v
		}
	}
	want, parked := h.parks[point]
	park := parked && !h.done[point] && (want == "" || want == vm)
	if park {
		h.done[point], h.parked = true, true
	}
	ev.TsNs = failpoint.Now()
	b, err := json.Marshal(ev)
	if err == nil {
		_, err = h.conn.Write(b)
	}
	h.mu.Unlock()
	if err != nil {
		// the park would never be seen: the write fails as the harness's
		return fmt.Errorf("ledger: trace %s: %w", point, err)
	}
	if !park {
		return nil
	}
	return failpoint.Park(ctx, h.ctl, point)
}
