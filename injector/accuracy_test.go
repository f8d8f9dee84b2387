package injector

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/internal/hoststat"
)

// accuracyOffsets are the offsets the issue asks for.
var accuracyOffsets = []time.Duration{0, time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond, time.Second}

func pct(xs []int64, p float64) int64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]int64(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// benchInjections is how many injections each BenchmarkAtAccuracy case
// makes: VMCHAOS_BENCH_INJECTIONS, default 1000 (the figure).
func benchInjections(b *testing.B) int {
	if s := os.Getenv("VMCHAOS_BENCH_INJECTIONS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < len(accuracyOffsets) {
			b.Fatalf("VMCHAOS_BENCH_INJECTIONS=%q: want an integer ≥ %d", s, len(accuracyOffsets))
		}
		return n
	}
	return 1000
}

// BenchmarkAtAccuracy: `at acc.tick + OFFSET` sigkill-main injections (equal
// shares of offsets 0/1/10/100/1000 ms) against 4 helper processes that hit
// their point every 2 ms while a noise unit floods the trace (~2.5k
// datagrams/s in all), per supervisor, on an idle machine and with one core
// loaded by a CPU hog in a second process. Reports actual − requested, where
// requested is the hit's own CLOCK_MONOTONIC stamp + offset and actual is
// taken right after the pidfd_send_signal returned. Run with -benchtime 1x.
//
// A row the host took ≥ stealHigh of the CPU from is run again, up to
// VMCHAOS_BENCH_TRIES times in all (default 3); the second try of "idle" is
// "idle#01". Every try is printed; a row is judged on its first try under
// stealHigh, whatever that try's figures (see boundTable.summary). There is
// no waiting for a quiet host before a try: the steal here accrues as the
// host wakes halted vCPUs, so only a probe that wakes as the row does
// would foretell a row's, and the row is that probe.
func BenchmarkAtAccuracy(b *testing.B) {
	tries := benchTries(b)
	row := func(b *testing.B, name string, run func(*testing.B)) {
		for try := 1; try <= tries; try++ {
			n := bounds.len()
			if !b.Run(name, run) || bounds.len() == n {
				return // failed or skipped: no figures to judge
			}
			if !bounds.last().stealIsHigh {
				return
			}
		}
	}
	for _, kind := range []string{KindBuiltin, KindSandbox} {
		b.Run(kind, func(b *testing.B) {
			if kind == KindSandbox && SandboxPreflight() != "" {
				b.Skip(SandboxPreflight())
			}
			for _, load := range []string{"idle", "loaded"} {
				row(b, load, func(b *testing.B) {
					if load == "loaded" {
						startHog(b)
					}
					accuracy(b, kind, benchInjections(b))
				})
			}
			// The same faults armed inside the victim (InVictim): the
			// victim's own timer fires, no trace delivery in between.
			for _, load := range []string{"idle", "loaded"} {
				row(b, "in-victim-"+load, func(b *testing.B) {
					if load == "loaded" {
						startHog(b)
					}
					accuracyInVictim(b, kind, benchInjections(b))
				})
			}
		})
	}
	b.Log(bounds.summary())
}

// benchTries: VMCHAOS_BENCH_TRIES, how many times a row may run while the
// host's steal is high; default 3.
func benchTries(b *testing.B) int {
	s := os.Getenv("VMCHAOS_BENCH_TRIES")
	if s == "" {
		return 3
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		b.Fatalf("VMCHAOS_BENCH_TRIES=%q: want an integer ≥ 1", s)
	}
	return n
}

// rowBound is how one row fared against issue #20's bounds: idle, p99 ≤ 1 ms
// and p99.9 ≤ 2 ms; loaded, p99 ≤ 2 ms.
type rowBound struct {
	row         string // "builtin/in-victim-idle"
	try         int    // 1 for the first
	p99, p999   int64
	steal       float64 // % of CPU the host took during the row; -1: unknown
	unmet       []string
	stealIsHigh bool
}

// stealHigh: from this share of CPU taken by the host, a row's tail is the
// host's as much as the code's. On 2026-12-02 (07:48-08:50) all 15 in-victim
// idle rows run under 1 % steal met the bound (p99.9 ≤ 1.63 ms); of the 14
// run at 1-35 %, 9 did not (p99.9 up to 40 ms).
const stealHigh = 1.0

// checkBound judges one try of a row; name is the sub-benchmark's, less
// "BenchmarkAtAccuracy/": "builtin/idle", or "builtin/idle#01" for its
// second try.
func checkBound(name string, all []int64, steal float64) rowBound {
	row, n, _ := strings.Cut(name, "#")
	try, _ := strconv.Atoi(n)
	r := rowBound{row: row, try: try + 1, p99: pct(all, .99), p999: pct(all, .999), steal: steal, stealIsHigh: steal >= stealHigh}
	if strings.HasSuffix(row, "idle") {
		if r.p99 > int64(time.Millisecond) {
			r.unmet = append(r.unmet, "p99 > 1 ms")
		}
		if r.p999 > int64(2*time.Millisecond) {
			r.unmet = append(r.unmet, "p99.9 > 2 ms")
		}
	} else if r.p99 > int64(2*time.Millisecond) {
		r.unmet = append(r.unmet, "p99 > 2 ms")
	}
	return r
}

func (r rowBound) String() string {
	verdict := "met"
	if len(r.unmet) > 0 {
		verdict = "NOT met (" + strings.Join(r.unmet, ", ") + ")"
	}
	steal := "steal ?"
	if r.steal >= 0 {
		steal = fmt.Sprintf("steal %4.1f %%", r.steal)
	}
	name := r.row
	if r.try > 1 {
		name += fmt.Sprintf(" (try %d)", r.try)
	}
	s := fmt.Sprintf("%-34s p99 %5.2f ms  p99.9 %5.2f ms  %s  %s", name, float64(r.p99)/1e6, float64(r.p999)/1e6, steal, verdict)
	if r.stealIsHigh {
		s += fmt.Sprintf("; host steal ≥ %.0f %%: the tail is partly the host's", stealHigh)
	}
	return s
}

// bounds collects the rows of one BenchmarkAtAccuracy run.
var bounds boundTable

type boundTable struct {
	mu   sync.Mutex
	rows []rowBound
}

func (t *boundTable) add(r rowBound) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rows = append(t.rows, r)
}

func (t *boundTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.rows)
}

func (t *boundTable) last() rowBound {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rows[len(t.rows)-1]
}

// summary lists every try, then judges each row on its first try under
// stealHigh (or of unknown steal), whatever its figures: a later quiet try
// that met cannot stand in for an earlier quiet one that did not. A row
// with no such try is not judged, which is not "met".
func (t *boundTable) summary() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := []string{"issue #20's bounds (idle: p99 ≤ 1 ms, p99.9 ≤ 2 ms; loaded: p99 ≤ 2 ms), every try:"}
	var order []string               // rows in the order they first ran
	judged := map[string]*rowBound{} // nil: no quiet try yet
	for i, r := range t.rows {
		lines = append(lines, "  "+r.String())
		j, seen := judged[r.row]
		if !seen {
			order = append(order, r.row)
		}
		if j == nil && !r.stealIsHigh {
			j = &t.rows[i]
		}
		judged[r.row] = j
	}
	lines = append(lines, fmt.Sprintf("judged on each row's first try under %.0f %% host steal:", stealHigh))
	met, unmet, busy := 0, 0, 0
	for _, row := range order {
		r := judged[row]
		if r == nil {
			busy++
			lines = append(lines, fmt.Sprintf("  %-34s not judged: host steal ≥ %.0f %% in every try", row, stealHigh))
			continue
		}
		if len(r.unmet) > 0 {
			unmet++
		} else {
			met++
		}
		lines = append(lines, "  "+r.String())
	}
	lines = append(lines, fmt.Sprintf("%d of %d row(s) met their bound, %d did not, %d not judged (host busy)", met, len(order), unmet, busy))
	return strings.Join(lines, "\n")
}

// startHog runs a CPU hog in a second process (this binary in helper mode
// "hog"): one thread spinning, bounded to 15 minutes by itself, killed by its
// pid when the benchmark ends.
func startHog(b *testing.B) {
	c := exec.Command(helperArgv(b)[0], "-test.run=^$")
	c.Env = append(os.Environ(), envHelper+"=hog", "GOMAXPROCS=1", "HELPER_HOG_FOR=15m")
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = c.Process.Kill()
		_ = c.Wait()
	})
}

// hog spins one thread for at most d.
func hog(d time.Duration) {
	runtime.LockOSThread()
	end := time.Now().Add(d)
	x := uint64(1)
	for time.Now().Before(end) {
		for i := 0; i < 1<<16; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	_ = x
}

func accuracy(b *testing.B, kind string, total int) {
	b.Setenv(EnvRegistry, filepath.Join(b.TempDir(), "registry"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	sup, err := NewSupervisor(ctx, kind, filepath.Join(b.TempDir(), "state"))
	if err != nil {
		b.Fatal(err)
	}
	defer sup.Close()
	dir := b.TempDir()
	tr, err := ListenTrace(filepath.Join(dir, "trace.sock"))
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	inj := New(sup, tr, Options{})
	const lanes = 4
	start := func(name, vm, point string, every time.Duration) {
		err := sup.Start(ctx, UnitSpec{Name: name, Argv: helperArgv(b), RestartSec: 10 * time.Millisecond,
			Env: []string{envHelper + "=loop", "HELPER_VM=" + vm, "HELPER_POINTS=" + point, "HELPER_EVERY=" + every.String(),
				"VMCHAOS_TRACE=" + tr.Path()}})
		if err != nil {
			b.Fatal(err)
		}
	}
	start("noise", "noise", "noise.tick", 2*time.Millisecond)
	for l := 0; l < lanes; l++ {
		start(fmt.Sprintf("acc%d", l), fmt.Sprintf("lane%d", l), "acc.tick", 2*time.Millisecond)
	}
	b.ResetTimer()
	gc0 := readGC()
	byOff := map[time.Duration][]int64{}
	var all, delivery, late, harness []int64
	var mu sync.Mutex
	var failed []string
	for it := 0; it < b.N; it++ {
		var wg sync.WaitGroup
		for l := 0; l < lanes; l++ {
			wg.Add(1)
			go func(l int) {
				defer wg.Done()
				unit := fmt.Sprintf("acc%d", l)
				for k := l; k < total; k += lanes {
					off := accuracyOffsets[k%len(accuracyOffsets)]
					if err := sup.WaitActive(ctx, unit); err != nil {
						mu.Lock()
						failed = append(failed, err.Error())
						mu.Unlock()
						return
					}
					tg := Trigger{Kind: TriggerAt, Point: "acc.tick", N: 1, VM: fmt.Sprintf("lane%d", l), Offset: off}
					a, err := inj.Arm(ctx, Fault{Kind: FaultSigkillMain, Unit: unit}, tg)
					if err == nil {
						var r Injection
						if r, err = a.Wait(ctx); err == nil && r.Err != "" {
							err = fmt.Errorf("%s", r.Err)
						}
						if err == nil {
							mu.Lock()
							byOff[off] = append(byOff[off], r.ActualNs-r.RequestedNs)
							all = append(all, r.ActualNs-r.RequestedNs)
							delivery = append(delivery, r.HitRecvNs-r.TriggerNs)
							harness = append(harness, r.ActualNs-max(r.RequestedNs, r.HitRecvNs))
							if r.HitRecvNs > r.RequestedNs {
								late = append(late, r.HitRecvNs-r.RequestedNs)
							}
							mu.Unlock()
						}
					}
					if err != nil {
						mu.Lock()
						failed = append(failed, err.Error())
						mu.Unlock()
					}
				}
			}(l)
		}
		wg.Wait()
	}
	b.StopTimer()
	b.Log(gc0.since())
	reportAccuracy(b, kind, tr, gc0.host, total, byOff, all, delivery, late, harness, failed)
}

// gcStats: the harness's own GC cycles during a row; each one stops the
// world twice, the trace reader included.
type gcStats struct {
	n     uint32
	pause uint64
	host  hoststat.Sample // at the row's start, for its steal figure
}

func readGC() gcStats {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return gcStats{m.NumGC, m.PauseTotalNs, hoststat.Now()}
}

func (g gcStats) since() string {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	var worst uint64
	// GC number k's pause is PauseNs[(k+255)%256]; the row's are g.n+1..NumGC.
	for k := g.n + 1; k <= m.NumGC && k <= g.n+256; k++ {
		worst = max(worst, m.PauseNs[(k+255)%256])
	}
	return fmt.Sprintf("harness GC during the row: %d cycle(s), stop-the-world %.0fµs in all, longest %.0fµs",
		m.NumGC-g.n, float64(m.PauseTotalNs-g.pause)/1e3, float64(worst)/1e3)
}

func reportAccuracy(b *testing.B, kind string, tr *Trace, host hoststat.Sample, total int, byOff map[time.Duration][]int64, all, delivery, late, harness []int64, failed []string) {
	if len(failed) > 0 {
		b.Logf("%d injection(s) failed, first: %s", len(failed), failed[0])
	}
	us := func(ns int64) float64 { return float64(ns) / 1e3 }
	dist := func(xs []int64) string {
		return fmt.Sprintf("p50 %7.1fµs  p99 %7.1fµs  p99.9 %7.1fµs  max %7.1fµs", us(pct(xs, .5)), us(pct(xs, .99)), us(pct(xs, .999)), us(pct(xs, 1)))
	}
	var lines []string
	for _, off := range accuracyOffsets {
		xs := byOff[off]
		lines = append(lines, fmt.Sprintf("offset %6s n=%4d  %s  min %6.1fµs", FormatOffset(off), len(xs), dist(xs), us(pct(xs, 0))))
	}
	lines = append(lines, fmt.Sprintf("ALL    %6s n=%4d  %s", "", len(all), dist(all)))
	lines = append(lines, fmt.Sprintf("harness side (actual − max(requested, hit read)): %s", dist(harness)))
	lines = append(lines, fmt.Sprintf("hit delivery (emitter stamp → harness read):      %s; %d hit(s) read after their due time",
		dist(delivery), len(late)))
	b.Logf("%s supervisor, trace reader SCHED_FIFO=%v, actual − requested:\n%s", kind, tr.RT, strings.Join(lines, "\n"))
	if len(all) < total*b.N*9/10 {
		b.Fatalf("only %d of %d injections landed", len(all), total*b.N)
	}
	// the host ran something else on this VM's vCPUs: a latency this machine
	// cannot remove. Read once per row, for the verdict line.
	steal, ok := host.StealPctSince()
	if !ok {
		steal = -1
	}
	_, row, _ := strings.Cut(b.Name(), "/") // "builtin/in-victim-idle"
	r := checkBound(row, all, steal)
	bounds.add(r)
	b.Log(r.String())
	b.ReportMetric(us(pct(all, .5)), "p50-µs")
	b.ReportMetric(us(pct(all, .99)), "p99-µs")
	b.ReportMetric(us(pct(all, .999)), "p99.9-µs")
	b.ReportMetric(us(pct(all, 1)), "max-µs")
	b.ReportMetric(float64(len(all)), "injections")
}

// accuracyInVictim: the victims arm the fault themselves
// (VictimSpec → VMCHAOS_FAILPOINTS); lanes per offset so that the 1 s lanes
// do not dominate the run time.
func accuracyInVictim(b *testing.B, kind string, total int) {
	b.Setenv(EnvRegistry, filepath.Join(b.TempDir(), "registry"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	sup, err := NewSupervisor(ctx, kind, filepath.Join(b.TempDir(), "state"))
	if err != nil {
		b.Fatal(err)
	}
	defer sup.Close()
	tr, err := ListenTrace(filepath.Join(b.TempDir(), "trace.sock"))
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	inj := New(sup, tr, Options{})
	start := func(name, vm, point string, every time.Duration, spec string) {
		err := sup.Start(ctx, UnitSpec{Name: name, Argv: helperArgv(b), RestartSec: 10 * time.Millisecond,
			Env: []string{envHelper + "=loop", "HELPER_VM=" + vm, "HELPER_POINTS=" + point, "HELPER_EVERY=" + every.String(),
				"VMCHAOS_TRACE=" + tr.Path(), "VMCHAOS_FAILPOINTS=" + spec, "HELPER_FIRST_HIT_AFTER=250ms"}})
		if err != nil {
			b.Fatal(err)
		}
	}
	start("noise", "noise", "noise.tick", 2*time.Millisecond, "")
	type lane struct {
		unit string
		t    Trigger
		n    int
	}
	var lanes []lane
	for _, off := range accuracyOffsets {
		per := total / len(accuracyOffsets)
		nl := max(1, int(off/(125*time.Millisecond))) // 1 s: 8 lanes
		for l := 0; l < nl; l++ {
			ln := lane{unit: fmt.Sprintf("v%s-%d", FormatOffset(off), l), n: per / nl}
			if l < per%nl {
				ln.n++
			}
			ln.t = Trigger{Kind: TriggerAt, Point: "acc.tick", N: 1, VM: ln.unit, Offset: off}
			spec, err := VictimSpec(Fault{Kind: FaultSigkillMain, Unit: ln.unit}, ln.t)
			if err != nil {
				b.Fatal(err)
			}
			start(ln.unit, ln.unit, "acc.tick", 2*time.Millisecond, spec)
			lanes = append(lanes, ln)
		}
	}
	b.ResetTimer()
	gc0 := readGC()
	byOff := map[time.Duration][]int64{}
	var all, delivery, late, harness []int64
	var mu sync.Mutex
	var failed []string
	fail := func(err error) {
		mu.Lock()
		failed = append(failed, err.Error())
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for _, ln := range lanes {
		wg.Add(1)
		go func(ln lane) {
			defer wg.Done()
			retries := 0
			for k := 0; k < ln.n; k++ {
				mark := tr.Mark()
				if err := sup.WaitActive(ctx, ln.unit); err != nil {
					fail(err)
					return
				}
				a, err := inj.Arm(ctx, Fault{Kind: FaultSigkillMain, Unit: ln.unit}, ln.t, From(mark), InVictim())
				if err != nil {
					// between incarnations: nothing was armed, try again
					if retries++; retries > 100 {
						fail(err)
						return
					}
					time.Sleep(10 * time.Millisecond)
					k--
					continue
				}
				retries = 0
				r, err := a.Wait(ctx)
				if err == nil && r.Err != "" {
					err = fmt.Errorf("%s", r.Err)
				}
				if err != nil {
					fail(err)
					continue
				}
				mu.Lock()
				byOff[ln.t.Offset] = append(byOff[ln.t.Offset], r.ActualNs-r.RequestedNs)
				all = append(all, r.ActualNs-r.RequestedNs)
				if r.HitRecvNs > 0 {
					delivery = append(delivery, r.HitRecvNs-r.TriggerNs)
					if r.HitRecvNs > r.RequestedNs {
						late = append(late, r.HitRecvNs-r.RequestedNs)
					}
				}
				harness = append(harness, r.ActualNs-r.RequestedNs) // no harness in the path
				mu.Unlock()
			}
		}(ln)
	}
	wg.Wait()
	b.StopTimer()
	b.Log(whyLate(tr.Events()))
	b.Log(gc0.since())
	reportAccuracy(b, kind+" (in-victim)", tr, gc0.host, total, byOff, all, delivery, late, harness, failed)
}

// whyLate sums up the victims' own failpoint.signal datagrams: how many the
// backup thread fired, and of the signals that fired over 0.5 ms late, how
// many the timer thread began to spin for in time (then lost its CPU) and
// how many it woke for late.
func whyLate(evs []failpoint.Event) string {
	var backup, late, spun, wokeLate int
	for _, e := range evs {
		if e.Point != failpoint.SignalPoint {
			continue
		}
		if e.Attrs["backup"] != nil {
			backup++
		}
		l, _ := e.Attrs["late_ns"].(float64)
		if l <= 5e5 {
			continue
		}
		late++
		if spin, ok := e.Attrs["spin_ns"].(float64); ok && spin >= 0 {
			spun++
		} else if ok {
			wokeLate++
		}
	}
	return fmt.Sprintf("victims' signals: %d fired by the backup thread; %d over 0.5 ms late (the timer thread spun in time for %d, woke late for %d, the rest fired in the hit or by the backup)",
		backup, late, spun, wokeLate)
}

// TestCheckBound: the bench's verdict per row follows issue #20's bounds,
// idle and loaded, and flags a row the host took ≥ stealHigh from.
func TestCheckBound(t *testing.T) {
	ms := func(f float64) int64 { return int64(f * 1e6) }
	// 1,000 samples: p99 is the 990th, p99.9 the 999th
	dist := func(p99, p999 float64) []int64 {
		xs := make([]int64, 1000)
		for i := range xs {
			switch {
			case i >= 998:
				xs[i] = ms(p999)
			case i >= 989:
				xs[i] = ms(p99)
			default:
				xs[i] = 1000
			}
		}
		return xs
	}
	for _, tc := range []struct {
		row       string
		p99, p999 float64
		steal     float64
		unmet     string
		high      bool
	}{
		{"builtin/idle", 0.9, 1.9, 0.1, "", false},
		{"sandbox/in-victim-idle", 0.9, 2.1, 0.1, "p99.9 > 2 ms", false},
		{"sandbox/in-victim-idle", 1.1, 2.1, 11.9, "p99 > 1 ms, p99.9 > 2 ms", true},
		{"sandbox/loaded", 1.9, 9, 0.3, "", false},
		{"builtin/in-victim-loaded", 2.1, 9, -1, "p99 > 2 ms", false},
	} {
		r := checkBound(tc.row, dist(tc.p99, tc.p999), tc.steal)
		if got := strings.Join(r.unmet, ", "); got != tc.unmet || r.stealIsHigh != tc.high {
			t.Errorf("%s p99 %v p99.9 %v steal %v: unmet %q high %v, want %q %v (%s)", tc.row, tc.p99, tc.p999, tc.steal, got, r.stealIsHigh, tc.unmet, tc.high, r)
		}
		if notMet := strings.Contains(r.String(), "NOT met"); notMet != (tc.unmet != "") {
			t.Errorf("%s: says %q", tc.row, r)
		}
	}
}

// TestBoundSummaryJudgesFirstQuietTry: a row is judged on its first try
// under stealHigh, not on its best one, and a row the host was busy for in
// every try is not counted as met.
func TestBoundSummaryJudgesFirstQuietTry(t *testing.T) {
	ms := func(f float64) []int64 {
		xs := make([]int64, 1000)
		for i := range xs {
			xs[i] = int64(f * 1e6)
		}
		return xs
	}
	var tb boundTable
	for _, r := range []rowBound{
		checkBound("builtin/idle", ms(0.1), 0.2),              // met at once
		checkBound("sandbox/idle", ms(0.1), 5),                // met, but busy
		checkBound("sandbox/idle#01", ms(3), 0.4),             // first quiet try: not met
		checkBound("sandbox/idle#02", ms(0.1), 0.1),           // later quiet try that met: does not count
		checkBound("sandbox/in-victim-idle", ms(0.1), 9),      // busy
		checkBound("sandbox/in-victim-idle#01", ms(0.1), 2.5), // busy again: not judged
		checkBound("builtin/loaded", ms(1.5), -1),             // steal unknown: judged
	} {
		tb.add(r)
	}
	if r := tb.rows[2]; r.row != "sandbox/idle" || r.try != 2 {
		t.Fatalf("sandbox/idle#01 parsed as row %q try %d, want sandbox/idle try 2", r.row, r.try)
	}
	s := tb.summary()
	_, judged, ok := strings.Cut(s, "judged on each row's first try")
	if !ok {
		t.Fatalf("no judged section:\n%s", s)
	}
	for _, want := range []string{
		"builtin/idle ",
		"sandbox/idle (try 2)",
		"sandbox/in-victim-idle             not judged",
		"2 of 4 row(s) met their bound, 1 did not, 1 not judged (host busy)",
	} {
		if !strings.Contains(judged, want) {
			t.Errorf("judged section lacks %q:\n%s", want, judged)
		}
	}
	if strings.Contains(judged, "(try 3)") {
		t.Errorf("judged a later try over the first quiet one:\n%s", judged)
	}
}
