package checker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/reports"
)

var lost = &Input{TraceLoss: errors.New("trace incomplete: 1 datagram(s) lost (vmctl pid 42: seq 7 missing)")}

func ev(ts int64, proc, point string, pid int, attrs map[string]any) failpoint.Event {
	return failpoint.Event{TsNs: ts, Proc: proc, Point: point, Pid: pid, Attrs: attrs}
}

// historyCase is one row: the invariant judged over fixture data.
type historyCase struct {
	name  string
	judge func() reports.Invariant
	ok    bool
	want  string // in the evidence
}

func runHistory(t *testing.T, cases []historyCase) {
	t.Helper()
	for _, c := range cases {
		got := c.judge()
		if got.OK != c.ok || !strings.Contains(got.Evidence, c.want) {
			t.Errorf("%s: OK=%v evidence %q; want OK=%v and %q", c.name, got.OK, got.Evidence, c.ok, c.want)
		}
	}
}

func TestNoFailedWriteTable(t *testing.T) {
	const fault = 1000
	failed := []failpoint.Event{ev(500, "nodeagent", "agent.failed", 1, nil), ev(1500, "nodeagent", "agent.failed", 1, map[string]any{"reason": "save refused"})}
	cleanEvs := failed[:1] // a failure before the fault is not this case's
	runHistory(t, []historyCase{
		{"violated", func() reports.Invariant { return NoFailedWriteInvariant(&Input{}, failed, fault) }, false, "save refused"},
		{"clean", func() reports.Invariant { return NoFailedWriteInvariant(&Input{}, cleanEvs, fault) }, true, ""},
		{"lost datagram", func() reports.Invariant { return NoFailedWriteInvariant(lost, cleanEvs, fault) }, false, "seq 7 missing"},
	})
}

func TestSaveRejectedBeforeCaptureTable(t *testing.T) {
	const fault = 1000
	capturedThenFailed := []failpoint.Event{
		ev(1100, "vmctl", "snapshot.save.captured", 77, nil),
		ev(1200, "nodeagent", "agent.child.exit", 5, map[string]any{"child_pid": float64(77), "code": float64(1)}),
	}
	capturedOK := []failpoint.Event{
		ev(1100, "vmctl", "snapshot.save.captured", 77, nil),
		ev(1200, "nodeagent", "agent.child.exit", 5, map[string]any{"child_pid": float64(77), "code": float64(0)}),
	}
	saveArgv := []any{"vmctl", "--root", "/r", "snapshot", "save", "--vm", "vm-a", "vm-a-hib"}
	refusedEarly := []failpoint.Event{
		ev(1200, "nodeagent", "agent.child.exit", 5, map[string]any{"child_pid": float64(78), "code": float64(1), "argv": saveArgv}),
	}
	noSave := []failpoint.Event{
		ev(900, "nodeagent", "agent.child.exit", 5, map[string]any{"child_pid": float64(76), "code": float64(0), "argv": saveArgv}),
	}
	runHistory(t, []historyCase{
		{"violated", func() reports.Invariant {
			return SaveRejectedBeforeCaptureInvariant(&Input{}, capturedThenFailed, fault, nil)
		}, false, "refused after the full capture"},
		{"harness victim", func() reports.Invariant {
			return SaveRejectedBeforeCaptureInvariant(&Input{}, capturedThenFailed, fault, map[int]bool{77: true})
		}, true, "1 completed capture"},
		{"refused at the preflight", func() reports.Invariant {
			return SaveRejectedBeforeCaptureInvariant(&Input{}, refusedEarly, fault, nil)
		}, true, "1 snapshot save(s) after the fault, 0 completed"},
		{"no save after the fault", func() reports.Invariant {
			return SaveRejectedBeforeCaptureInvariant(&Input{}, noSave, fault, nil)
		}, false, "nothing to judge"},
		{"clean", func() reports.Invariant { return SaveRejectedBeforeCaptureInvariant(&Input{}, capturedOK, fault, nil) }, true, "none refused"},
		{"lost datagram", func() reports.Invariant { return SaveRejectedBeforeCaptureInvariant(lost, capturedOK, fault, nil) }, false, "incomplete"},
	})
}

func sample(start, ts int64, v float64) Sample {
	return Sample{StartNs: start, TsNs: ts, Values: map[string]float64{`nodeagent_wake_total{result="ok"}`: v},
		Types: map[string]string{"nodeagent_wake_total": "counter"}}
}

func TestMetricsMonotonicTable(t *testing.T) {
	two := []Sample{sample(0, 10, 1), sample(90, 100, 1)}
	across := []Sample{sample(0, 10, 1), sample(40, 45, 2), sample(60, 70, 2)} // restart at 50
	reset := []Sample{sample(0, 10, 3), sample(60, 70, 1)}
	refused := []ScrapeFailure{{TsNs: 52, Err: "connection refused", Down: true}}
	runHistory(t, []historyCase{
		{"counter reset across a restart", func() reports.Invariant {
			return MetricsMonotonicInvariant(&Input{}, reset, nil, []int64{50})
		}, false, "went 3 → 1"},
		{"clean across a restart", func() reports.Invariant {
			return MetricsMonotonicInvariant(&Input{}, across, refused, []int64{50})
		}, true, "3 samples across 1 restart"},
		{"one scrape", func() reports.Invariant {
			return MetricsMonotonicInvariant(&Input{}, two[:1], nil, nil)
		}, false, "only 1 scrape"},
		{"no scrape", func() reports.Invariant { return MetricsMonotonicInvariant(&Input{}, nil, nil, nil) }, false, "only 0 scrape"},
		{"no sample after the restart", func() reports.Invariant {
			return MetricsMonotonicInvariant(&Input{}, []Sample{sample(0, 10, 1), sample(20, 30, 1)}, refused, []int64{50})
		}, false, "no sample before (true) and after (false)"},
		{"no sample before the restart", func() reports.Invariant {
			return MetricsMonotonicInvariant(&Input{}, []Sample{sample(60, 70, 1), sample(80, 90, 1)}, nil, []int64{50})
		}, false, "before (false)"},
		{"sample requested before the restart, read after", func() reports.Invariant {
			return MetricsMonotonicInvariant(&Input{}, []Sample{sample(0, 10, 1), sample(45, 55, 1)}, nil, []int64{50})
		}, false, "after (false)"},
		{"a wrong answer", func() reports.Invariant {
			return MetricsMonotonicInvariant(&Input{}, two, []ScrapeFailure{{TsNs: 50, Err: "HTTP 500"}}, nil)
		}, false, "HTTP 500"},
		{"lost datagram (a restart may be missing)", func() reports.Invariant {
			return MetricsMonotonicInvariant(lost, two, nil, nil)
		}, false, "incomplete"},
	})
}

func TestRestartsAreAgentStartsAfterSince(t *testing.T) {
	evs := []failpoint.Event{ev(5, "nodeagent", "agent.started", 1, nil), ev(30, "nodeagent", "agent.started", 2, nil),
		ev(20, "nodeagent", "agent.started", 3, nil), ev(25, "vmctl", "snapshot.save.locked", 4, nil)}
	if got := Restarts(evs, 10); len(got) != 2 || got[0] != 20 || got[1] != 30 {
		t.Fatalf("Restarts = %v", got)
	}
}

func TestLedgerCleanTable(t *testing.T) {
	stable := ledger.Verdict{Guest: "a", Stable: 2, OK: true}
	ram := ledger.Verdict{Guest: "a", Stable: 2, RAMChecked: true, BootIDBefore: "b1", BootIDAfter: "b1", OK: true}
	lostV := ledger.Verdict{Guest: "a", Lost: 1, OK: false, Message: "1 acked marker(s) LOST"}
	noBase := ledger.Verdict{Guest: "a", Stable: 2, RAMChecked: true, BootIDAfter: "b2", OK: true}
	runHistory(t, []historyCase{
		{"lost marker", func() reports.Invariant { return LedgerCleanInvariant([]LedgerResult{{Guest: "a", Verdict: lostV}}) }, false, "LOST"},
		{"clean", func() reports.Invariant {
			return LedgerCleanInvariant([]LedgerResult{{Guest: "a", Verdict: stable}, {Guest: "b", Verdict: ram}})
		}, true, "2 guest(s) verified"},
		{"SSH error", func() reports.Invariant {
			return LedgerCleanInvariant([]LedgerResult{{Guest: "a", Err: errors.New("verify: guest a unreachable")}})
		}, false, "unreachable"},
		{"RAM check without a baseline", func() reports.Invariant {
			return LedgerCleanInvariant([]LedgerResult{{Guest: "a", Verdict: noBase}})
		}, false, "without a journaled boot id baseline"},
		{"nothing verified", func() reports.Invariant { return LedgerCleanInvariant(nil) }, false, "no guest was verified"},
	})
}

func TestTraceLoss(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "trace.sock")
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	if err := TraceLoss(sock, 0, "", nil); err != nil {
		t.Fatalf("complete trace: %v", err)
	}
	for name, err := range map[string]error{
		"lost":      TraceLoss(sock, 0, "", errors.New("vmctl pid 9: seq 3 missing")),
		"malformed": TraceLoss(sock, 2, "unexpected EOF", nil),
		"gone":      TraceLoss(filepath.Join(dir, "nope.sock"), 0, "", nil),
	} {
		if err == nil {
			t.Errorf("%s: trace reported complete", name)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if TraceLoss(filepath.Join(dir, "file"), 0, "", nil) == nil {
		t.Error("a plain file where the socket was reads as complete")
	}
}

// TestRegistryVerify: a pushed snapshot is readable when its manifest names
// a data file of the size and digest it says; anything else is evidence.
func TestRegistryVerify(t *testing.T) {
	reg := t.TempDir()
	data := []byte("snapshot bytes")
	sum := sha256.Sum256(data)
	file := "b.0123456789abcdef.snap"
	if err := os.WriteFile(filepath.Join(reg, file), data, 0o644); err != nil {
		t.Fatal(err)
	}
	put := func(m manifest) {
		b, _ := json.Marshal(m)
		if err := os.WriteFile(filepath.Join(reg, "b.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	good := manifest{Name: "b", File: file, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data)), SnapshotID: "S1"}
	put(good)
	var c digestCache
	if err := c.verify(reg, "b"); err != nil {
		t.Fatalf("good manifest: %v", err)
	}
	if err := c.verify(reg, "other"); err == nil {
		t.Fatal("no manifest verified")
	}
	bad := good
	bad.SHA256 = strings.Repeat("0", 64)
	put(bad)
	if err := c.verify(reg, "b"); err == nil || !strings.Contains(err.Error(), "digest") {
		t.Fatalf("wrong digest: %v", err)
	}
	put(good)
	// the data changed under an unchanged manifest: the cache keys on
	// size and mtime, so a rewrite is hashed again
	if err := os.WriteFile(filepath.Join(reg, file), []byte("snapshot bytez"), 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Second)
	_ = os.Chtimes(filepath.Join(reg, file), later, later)
	if err := c.verify(reg, "b"); err == nil {
		t.Fatal("corrupted data verified")
	}
	if err := os.Remove(filepath.Join(reg, file)); err != nil {
		t.Fatal(err)
	}
	if err := c.verify(reg, "b"); err == nil {
		t.Fatal("missing data verified")
	}
	if err := os.WriteFile(filepath.Join(reg, "b.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.verify(reg, "b"); err == nil {
		t.Fatal("torn manifest verified")
	}
}

// TestScraperKeepsFailures: a wrong answer is a failure the check sees, a
// dead endpoint is a gap; neither is dropped.
func TestScraperKeepsFailures(t *testing.T) {
	status := http.StatusInternalServerError
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status)
		fmt.Fprint(w, expo)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	s := &Scraper{addr: func() string { return addr }}
	ctx := context.Background()
	if s.ScrapeNow(ctx, failpoint.Now) {
		t.Fatal("HTTP 500 scraped as a sample")
	}
	status = http.StatusOK
	if !s.ScrapeNow(ctx, failpoint.Now) {
		t.Fatalf("good scrape failed: %+v", s.Failures())
	}
	// a port nothing listens on
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	addr = dead
	if s.ScrapeNow(ctx, failpoint.Now) {
		t.Fatal("dead endpoint scraped")
	}
	f := s.Failures()
	if len(f) != 2 || f[0].Down || !strings.Contains(f[0].Err, "HTTP 500") || !f[1].Down {
		t.Fatalf("failures = %+v", f)
	}
	if smp := s.Samples(); len(smp) != 1 || smp[0].StartNs == 0 || smp[0].TsNs < smp[0].StartNs {
		t.Fatalf("samples = %+v", smp)
	}
	inv := MetricsMonotonicInvariant(&Input{}, s.Samples(), f, nil)
	if inv.OK {
		t.Fatalf("a 500 and one sample passed: %+v", inv)
	}
}

// TestCollectGoalsProbes: a ready intent is probed over SSH (its error and
// a missing probe are evidence), a hibernated one is looked up in the
// registry; intents not at their goal are not probed.
func TestCollectGoalsProbes(t *testing.T) {
	reg := t.TempDir()
	var asked []string
	in := &Input{Goals: map[string]string{"a": GoalReady, "b": GoalHibernated, "c": GoalReady, "n": GoalReady},
		Registry: reg, BootID: func(_ context.Context, name, addr string) (string, error) {
			asked = append(asked, name+"@"+addr)
			if name == "c" {
				return "", errors.New("ssh: handshake failed")
			}
			return "boot-1", nil
		}}
	p := &Poll{Views: map[string]AgentView{"a": {Lifecycle: GoalReady}, "b": {Lifecycle: GoalHibernated},
		"c": {Lifecycle: GoalReady}, "n": {Lifecycle: "creating"}},
		VMs: []manager.VM{{Name: "a", Address: "127.0.0.2:22"}, {Name: "c", Address: "127.0.0.3:22"}}}
	p.collectGoals(context.Background(), in)
	if len(asked) != 2 || p.Boot["a"].BootID != "boot-1" || p.Boot["c"].Err == nil {
		t.Fatalf("asked %v, boot %+v", asked, p.Boot)
	}
	if _, probed := p.Boot["n"]; probed {
		t.Fatal("an intent not at its goal was probed")
	}
	if err := p.Pushed["b"]; err == nil {
		t.Fatal("an empty registry verified b")
	}
	in.BootID = nil
	p.collectGoals(context.Background(), in)
	if !errors.Is(p.Boot["a"].Err, errNoProbe) {
		t.Fatalf("no probe: %+v", p.Boot["a"])
	}
	if ev := checkIntentGoal(in, p); len(ev) == 0 {
		t.Fatal("ready without a probe passed")
	}
}

// TestALostDatagramIsNotAPass: the trace as it arrived has a sequence gap in
// the agent's datagrams (the one that said agent.failed may be the lost
// one); every trace-judged invariant refuses to pass on it.
func TestALostDatagramIsNotAPass(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "trace.sock")
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	events := []failpoint.Event{
		{TsNs: 900, Proc: "nodeagent", Pid: 40, Seq: 1, Point: "agent.started"},
		{TsNs: 1100, Proc: "nodeagent", Pid: 40, Seq: 2, Point: "agent.hibernate.begin"},
		// seq 3 never arrived
		{TsNs: 1200, Proc: "nodeagent", Pid: 40, Seq: 4, Point: "agent.child.exit",
			Attrs: map[string]any{"child_pid": float64(41), "code": float64(0), "argv": []any{"vmctl", "snapshot", "save", "vm-a"}}},
		{TsNs: 1300, Proc: "nodeagent", Pid: 40, Seq: 5, Point: "agent.hibernate.done"},
	}
	complete := &Input{TraceLoss: TraceLoss(sock, 0, "", Losses(injector.LostIn(events[:2])))}
	if complete.TraceLoss != nil {
		t.Fatalf("gapless trace reported lost: %v", complete.TraceLoss)
	}
	in := &Input{TraceLoss: TraceLoss(sock, 0, "", Losses(injector.LostIn(events)))}
	if in.TraceLoss == nil || !strings.Contains(in.TraceLoss.Error(), "nodeagent pid 40: datagram #3 lost") {
		t.Fatalf("TraceLoss = %v", in.TraceLoss)
	}
	samples := []Sample{sample(0, 10, 1), sample(1000, 1010, 1)}
	for _, inv := range []reports.Invariant{
		NoFailedWriteInvariant(in, events, 1000),
		SaveRejectedBeforeCaptureInvariant(in, events, 1000, nil),
		MetricsMonotonicInvariant(in, samples, nil, Restarts(events, 0)),
	} {
		if inv.OK || !strings.Contains(inv.Evidence, "datagram #3 lost") {
			t.Errorf("%s with a lost datagram: OK=%v evidence %q", inv.Name, inv.OK, inv.Evidence)
		}
	}
	// the same judgements pass on the complete trace
	for _, inv := range []reports.Invariant{
		NoFailedWriteInvariant(complete, events, 1000),
		SaveRejectedBeforeCaptureInvariant(complete, events, 1000, nil),
	} {
		if !inv.OK {
			t.Errorf("%s on a complete trace: %q", inv.Name, inv.Evidence)
		}
	}
}

// TestScrapeCutOffIsAGapGarbageIsWrong: a body cut off mid-way (the agent
// died while answering) is a gap; a whole body that does not parse is a
// wrong answer, which fails metrics-monotonic.
func TestScrapeCutOffIsAGapGarbageIsWrong(t *testing.T) {
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100000")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, expo[:40])
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				c.Close()
			}
		}
	}))
	defer cut.Close()
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "nodeagent_wake_total{result=\"ok\" 3\n")
	}))
	defer garbage.Close()
	cl := &http.Client{Timeout: 5 * time.Second}
	if _, down, err := scrape(context.Background(), cl, strings.TrimPrefix(cut.URL, "http://")); err == nil || !down {
		t.Fatalf("cut-off body: down=%v err=%v", down, err)
	}
	if _, down, err := scrape(context.Background(), cl, strings.TrimPrefix(garbage.URL, "http://")); err == nil || down {
		t.Fatalf("garbage body: down=%v err=%v", down, err)
	}
}
