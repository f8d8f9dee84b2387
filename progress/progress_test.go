package progress

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/internal/lockedbuf"
	"github.com/vmchaos/vmchaos/reports"
)

// fakeClock is a settable now().
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func testMeter(out *lockedbuf.Buffer, tty bool, every time.Duration) (*Meter, *fakeClock) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	m := New(out)
	m.tty, m.every, m.now = tty, every, clk.now
	return m, clk
}

func finish(m *Meter, verdict string, d time.Duration) {
	fmt.Fprintf(m, "%s case-%d\n", strings.ToUpper(verdict), m.done)
	m.Case(reports.Case{Verdict: verdict, DurationMs: float64(d) / float64(time.Millisecond)})
}

func TestLineCountsVerdictsAndEstimatesFromMeasuredDurations(t *testing.T) {
	out := &lockedbuf.Buffer{}
	m, clk := testMeter(out, false, time.Hour)
	m.Start("run", 10, 1)
	defer m.Stop()
	m.mu.Lock()
	if got := m.line(); !strings.Contains(got, "run 0/10") || !strings.Contains(got, "ETA ? (no case finished yet)") {
		t.Errorf("before any case: %q", got)
	}
	m.mu.Unlock()
	finish(m, reports.Pass, 2*time.Second)
	finish(m, reports.Fail, 4*time.Second)
	finish(m, reports.Inconclusive, 3*time.Second)
	finish(m, "flaky", 3*time.Second)
	clk.add(75 * time.Second)
	m.mu.Lock()
	got := m.line()
	m.mu.Unlock()
	// 4 done in 12 s of case time: 3 s each, 6 left → 18 s
	want := "run 4/10 | 1 pass 1 fail 1 inconclusive 1 other | elapsed 1m15s | ETA 18s"
	if got != want {
		t.Errorf("line = %q\nwant   %q", got, want)
	}
	m.Start("run", 10, 3) // three workers share what is left
	m.mu.Lock()
	if eta, _ := m.eta(); eta != 6*time.Second {
		t.Errorf("eta with 3 workers = %v, want 6s", eta)
	}
	m.mu.Unlock()
}

func TestOffATerminalASummaryLineComesEveryInterval(t *testing.T) {
	out := &lockedbuf.Buffer{}
	m, _ := testMeter(out, false, 20*time.Millisecond)
	m.Start("sweep", 3, 1)
	finish(m, reports.Pass, time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "progress: sweep 1/3") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	m.Stop()
	s := out.String()
	if !strings.Contains(s, "PASS case-0\n") || !strings.Contains(s, "progress: sweep 1/3 | 1 pass 0 fail 0 inconclusive") {
		t.Fatalf("output:\n%s", s)
	}
	if strings.Contains(s, "\r") || strings.Contains(s, "\x1b") {
		t.Errorf("terminal control codes in a log:\n%q", s)
	}
	if !strings.HasSuffix(s, "ETA 2s\n") {
		t.Errorf("the last line is not the final summary:\n%q", s)
	}
}

func TestOnATerminalTheLiveLineStaysBelowTheCaseLines(t *testing.T) {
	out := &lockedbuf.Buffer{}
	m, _ := testMeter(out, true, time.Hour)
	m.Start("selftest", 2, 1)
	finish(m, reports.Pass, time.Second)
	finish(m, reports.Fail, time.Second)
	m.Stop()
	m.Stop() // idempotent
	want := "PASS case-0\n" +
		"\r\x1b[Kselftest 0/2 | 0 pass 0 fail 0 inconclusive | elapsed 0s | ETA ? (no case finished yet)" +
		"\r\x1b[Kselftest 1/2 | 1 pass 0 fail 0 inconclusive | elapsed 0s | ETA 1s" +
		"\r\x1b[KFAIL case-1\n" +
		"\r\x1b[Kselftest 1/2 | 1 pass 0 fail 0 inconclusive | elapsed 0s | ETA 1s" +
		"\r\x1b[Kselftest 2/2 | 1 pass 1 fail 0 inconclusive | elapsed 0s | ETA 0s" +
		"\r\x1b[Kselftest 2/2 | 1 pass 1 fail 0 inconclusive | elapsed 0s | ETA 0s\n"
	if got := out.String(); got != want {
		t.Errorf("terminal output\n got %q\nwant %q", got, want)
	}
}

func TestNewIsLiveOnlyOnATerminal(t *testing.T) {
	if New(&bytes.Buffer{}).tty {
		t.Error("a buffer taken for a terminal")
	}
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if New(f).tty {
		t.Error("a regular file taken for a terminal")
	}
}
