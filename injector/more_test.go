package injector

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
)

func TestSigkillVMMKillsOnlyThatVMsVMM(t *testing.T) {
	s := newStack(t, KindBuiltin)
	self, _ := os.Executable()
	ch := filepath.Join(s.dir, "cloud-hypervisor")
	if err := os.Symlink(self, ch); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	vmm := map[string]int{}
	for _, vm := range []string{"VMA", "VMB"} {
		if err := s.sup.Start(ctx, UnitSpec{Name: "vmm-" + vm, Argv: []string{ch, "--api-socket", "path=" + filepath.Join(s.dir, "run", vm, "api.sock")},
			Env: []string{envHelper + "=child"}, RestartSec: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if err := s.sup.WaitActive(ctx, "vmm-"+vm); err != nil {
			t.Fatal(err)
		}
		vmm[vm], _ = s.sup.MainPID(ctx, "vmm-"+vm)
	}
	// the VM comes from the trigger hit's vm
	s.loopUnit(t, "vmctl", "VMA", "vm.clone.vmm-launched", 5*time.Millisecond)
	a, err := s.inj.Arm(ctx, Fault{Kind: FaultSigkillVMM}, MustParseTrigger("at vm.clone.vmm-launched@vm=VMA + 1ms"))
	if err != nil {
		t.Fatal(err)
	}
	inj, err := a.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !inj.Landed || inj.VictimPID != vmm["VMA"] {
		t.Fatalf("sigkill-vmm: %+v, want victim %d", inj, vmm["VMA"])
	}
	b, _ := Identify(vmm["VMB"])
	if !b.Alive() {
		t.Fatal("the other VM's VMM died")
	}
	if inj := s.inj.Inject(ctx, Fault{Kind: FaultSigkillVMM, VM: "NOSUCHVM"}); inj.Landed || inj.Err == "" {
		t.Fatalf("sigkill-vmm of a VM without VMM: %+v", inj)
	}
}

func TestAfterExitTriggerFiresAfterTheChildExits(t *testing.T) {
	s := newStack(t, KindBuiltin)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.sup.Start(ctx, UnitSpec{Name: "agent", Argv: helperArgv(t), RestartSec: 50 * time.Millisecond,
		Env: []string{envHelper + "=exec", "HELPER_CHILD_LIFE=30ms", failpoint.EnvTrace + "=" + s.tr.Path()}}); err != nil {
		t.Fatal(err)
	}
	if err := s.sup.WaitActive(ctx, "agent"); err != nil {
		t.Fatal(err)
	}
	main, _ := s.sup.MainPID(ctx, "agent")
	a, err := s.inj.Arm(ctx, Fault{Kind: FaultSigkillMain, Unit: "agent"}, MustParseTrigger("after-exit snapshot-save#2 + 3ms"))
	if err != nil {
		t.Fatal(err)
	}
	inj, err := a.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !inj.Landed || inj.VictimPID != main || inj.ActualNs < inj.TriggerNs+int64(3*time.Millisecond) {
		t.Fatalf("after-exit: %+v (main %d)", inj, main)
	}
	if inj.LastPhase != "agent.child.exit" && inj.LastPhase != "agent.child.exec" {
		t.Fatalf("last phase %q", inj.LastPhase)
	}
}

func TestTraceKeepsOrderCountsMalformedAndWaitsForPastHits(t *testing.T) {
	dir := t.TempDir()
	tr, err := ListenTrace(filepath.Join(dir, "t.sock"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("unixgram", tr.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send := func(s string) {
		if _, err := c.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	send(`{"ts_ns":10,"pid":7,"proc":"vmctl","point":"a","vm":"x"}`)
	send(`not json`)
	send(`{"ts_ns":11,"pid":7,"proc":"vmctl"}`)
	send(`{"ts_ns":12,"pid":7,"proc":"vmctl","point":"b","vm":"y"}`)
	send(`{"ts_ns":13,"pid":8,"proc":"vmctl","point":"a","vm":"y"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := tr.WaitPoint(ctx, 0, "a", 2, "")
	if err != nil || h.Event.TsNs != 13 || h.Index != 2 {
		t.Fatalf("second hit of a: %+v %v", h, err)
	}
	if h, err := tr.WaitPoint(ctx, 0, "a", 1, "y"); err != nil || h.Event.Pid != 8 {
		t.Fatalf("a@vm=y: %+v %v", h, err)
	}
	if n, last := tr.Malformed(); n != 2 || last == "" {
		t.Fatalf("malformed = %d %q", n, last)
	}
	var pts []string
	for _, e := range tr.Events() {
		pts = append(pts, e.Point)
	}
	if len(pts) != 3 || pts[0] != "a" || pts[1] != "b" || pts[2] != "a" {
		t.Fatalf("events %v", pts)
	}
	if e, ok := tr.LastOf(7, 100); !ok || e.Point != "b" {
		t.Fatalf("LastOf(7) = %+v", e)
	}
	p := filepath.Join(dir, "trace.jsonl")
	if err := tr.WriteJSONL(p); err != nil {
		t.Fatal(err)
	}
	back, err := ReadJSONL(p)
	if err != nil || len(back) != 3 || back[2].Pid != 8 {
		t.Fatalf("jsonl round trip: %v %v", back, err)
	}
	// a waiter blocked when the trace closes gets ErrTraceClosed
	errc := make(chan error, 1)
	go func() { _, err := tr.WaitPoint(ctx, 0, "never", 1, ""); errc <- err }()
	time.Sleep(20 * time.Millisecond)
	tr.Close()
	if err := <-errc; !errors.Is(err, ErrTraceClosed) {
		t.Fatalf("wait on closed trace: %v", err)
	}
	if _, err := os.Stat(tr.Path()); !os.IsNotExist(err) {
		t.Fatal("socket file left after Close")
	}
}

// BenchmarkTraceIngest: datagrams the trace reader takes in (parse, append,
// match against a pending waiter) per second, from one sender.
func BenchmarkTraceIngest(b *testing.B) {
	b.ReportAllocs()
	tr, c := traceAndSender(b)
	msg := []byte(`{"ts_ns":1234567890,"pid":4242,"proc":"vmctl","point":"snapshot.save.captured","vm":"UYUJHVIINCOFODLV4F7KJVRFJY","op":"op-1","attrs":{"i":1}}`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := tr.WaitPoint(ctx, 0, "never.hit", 1, ""); done <- err }()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
	}
	for tr.Len() < b.N {
		if ctx.Err() != nil {
			b.Fatalf("read %d of %d", tr.Len(), b.N)
		}
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	cancel()
	<-done
}

// TestLostReportsADroppedDatagram: the real failpoint emitter sends through a
// relay that drops its second datagram; the trace reports exactly that one as
// lost, and nothing for a stream that arrived whole.
func TestLostReportsADroppedDatagram(t *testing.T) {
	dir := t.TempDir()
	tr, err := ListenTrace(filepath.Join(dir, "t.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	relay, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "relay.sock"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	out, err := net.Dial("unixgram", tr.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	const sent = 5
	relayed := make(chan error, 1)
	go func() {
		buf := make([]byte, 1<<16)
		for i := 1; i <= sent; i++ {
			n, err := relay.Read(buf)
			if err != nil {
				relayed <- err
				return
			}
			if i == 2 {
				continue // the deliberate loss
			}
			if _, err := out.Write(buf[:n]); err != nil {
				relayed <- err
				return
			}
		}
		relayed <- nil
	}()
	if err := failpoint.Configure("vmctl", relay.LocalAddr().String(), "", ""); err != nil {
		t.Fatal(err)
	}
	defer failpoint.Reset()
	for i := 0; i < sent; i++ {
		if err := failpoint.Hit(context.Background(), fmt.Sprintf("p%d", i+1), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-relayed; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := tr.WaitPoint(ctx, 0, fmt.Sprintf("p%d", sent), 1, ""); err != nil {
		t.Fatal(err)
	}
	evs := tr.Events()
	// #2 was sent between #1 and #3, as their stamps say
	want := []Loss{{Proc: "vmctl", Pid: os.Getpid(), First: 2, Last: 2, AfterNs: evs[0].TsNs, BeforeNs: evs[1].TsNs}}
	if got := tr.Lost(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Lost() = %+v, want %+v", got, want)
	}
	var seqs []uint64
	for _, e := range tr.Events() {
		seqs = append(seqs, e.Seq)
	}
	if !reflect.DeepEqual(seqs, []uint64{1, 3, 4, 5}) {
		t.Fatalf("seqs %v", seqs)
	}
}

func TestLostInGapsRestartsAndOldEmitters(t *testing.T) {
	ev := func(proc string, pid int, seq uint64) failpoint.Event {
		return failpoint.Event{TsNs: 1, Proc: proc, Pid: pid, Point: "x", Seq: seq}
	}
	got := LostIn([]failpoint.Event{
		ev("vmctl", 7, 1), ev("vmctl", 7, 2), ev("vmctl", 7, 5), // 3..4 lost
		ev("nodeagent", 7, 2),                // same pid, other proc: #1 lost
		ev("vmctl", 8, 0), ev("vmctl", 8, 0), // no numbers: not judged
		ev("vmctl", 7, 6), ev("vmctl", 7, 3), // restart under pid 7: 1..2 of it lost
		ev("vmctl", 9, 1), ev("vmctl", 9, 2), // whole
	})
	// every datagram is stamped 1: each run lies between its neighbours'
	// stamps (after 0: the run began at #1)
	want := []Loss{
		{Proc: "vmctl", Pid: 7, First: 3, Last: 4, AfterNs: 1, BeforeNs: 1},
		{Proc: "nodeagent", Pid: 7, First: 1, Last: 1, BeforeNs: 1},
		{Proc: "vmctl", Pid: 7, First: 1, Last: 2, BeforeNs: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("LostIn = %v, want %v", got, want)
	}
	if want[0].Count() != 2 || want[0].String() != "vmctl pid 7: datagrams #3..#4 lost (2)" {
		t.Fatalf("%d %q", want[0].Count(), want[0].String())
	}
}

// lastOf, which stops early, gives what a scan of the whole trace gives
// whenever arrival order departs from stamp order by less than arrivalSlack.
func TestLastOfMatchesAFullScan(t *testing.T) {
	full := func(events []failpoint.Event, pid int, tsNs int64) (failpoint.Event, bool) {
		var best failpoint.Event
		found := false
		for _, e := range events {
			if e.Pid == pid && e.Point != failpoint.SignalPoint && e.TsNs <= tsNs && (!found || e.TsNs >= best.TsNs) {
				best, found = e, true
			}
		}
		return best, found
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 2000; round++ {
		n := rng.IntN(200)
		var events []failpoint.Event
		ts := int64(0)
		for i := 0; i < n; i++ {
			ts += rng.Int64N(int64(3 * time.Second))
			point := fmt.Sprintf("p%d", rng.IntN(4))
			if rng.IntN(10) == 0 {
				point = failpoint.SignalPoint
			}
			// delivered up to 5 s out of stamp order
			events = append(events, failpoint.Event{TsNs: ts - rng.Int64N(int64(5*time.Second)), Pid: 1 + rng.IntN(3), Point: point})
		}
		for q := 0; q < 10; q++ {
			pid, at := 1+rng.IntN(4), rng.Int64N(ts+int64(time.Second))
			want, wok := full(events, pid, at)
			got, gok := lastOf(len(events), func(i int) *failpoint.Event { return &events[i] }, pid, at)
			if wok != gok || want.TsNs != got.TsNs || want.Point != got.Point {
				t.Fatalf("round %d: lastOf(pid %d, %d) = %+v %v, a full scan gives %+v %v", round, pid, at, got, gok, want, wok)
			}
		}
	}
}
