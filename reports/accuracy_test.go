package reports

import (
	"html"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// withErrors gives case i of r one injection whose actual − requested is
// errs[i] (ns), and a delivery of 50 µs.
func withErrors(r *Results, errs ...int64) *Results {
	for i, e := range errs {
		d := int64(50_000)
		r.Cases[i].Injections = []Injection{{Fault: "sigkill-main", Trigger: "at p + 10ms", RequestedNs: 1_000_000_000,
			ActualNs: 1_000_000_000 + e, Landed: true, LastPhase: "p", IntendedPhase: "p", DeliveryNs: &d}}
	}
	return r
}

func TestGateRefusesARunWhoseInjectionErrorP99ExceedsTheBound(t *testing.T) {
	vs := make([]string, 100)
	errs := make([]int64, 100)
	for i := range vs {
		vs[i], errs[i] = Pass, 40_000 // 40 µs
	}
	errs[99] = 3_000_000 // one case 3 ms late: p99 of 100 is the 99th, still 40 µs
	r := withErrors(run(vs...), errs...)
	FillInjectionErrors(r)
	opt := DefaultGateOptions()
	opt.MaxInjectionError = time.Millisecond
	if g := Gate(r, nil, opt); g.Code != GatePass {
		t.Fatalf("one outlier in 100 must not move p99: %s", g)
	}
	errs[98] = -2_500_000 // an early fault counts as much as a late one
	r = withErrors(run(vs...), errs...)
	FillInjectionErrors(r)
	g := Gate(r, nil, opt)
	if g.Code != GateInconclusive || !strings.Contains(g.String(), "injection error p99 +2.50 ms over 100 timed injection(s) exceeds --max-injection-error 1ms (worst +3.00 ms in c99)") {
		t.Fatalf("gate %d:\n%s", g.Code, g)
	}
	if g := Gate(r, nil, DefaultGateOptions()); g.Code != GatePass {
		t.Fatalf("without --max-injection-error the error is reported, not judged: %s", g)
	}
}

func TestEveryWrittenInjectionCarriesItsError(t *testing.T) {
	r := withErrors(run(Pass, Pass), 250_000, 1_500_000)
	r.Cases[1].Injections = append(r.Cases[1].Injections, Injection{Fault: "stop", Err: "never fired"}) // no times: no error
	dir := t.TempDir()
	if err := WriteAll(dir, r); err != nil {
		t.Fatal(err)
	}
	back, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	in := back.Cases[0].Injections[0]
	if in.ErrorNs == nil || *in.ErrorNs != 250_000 || in.DeliveryNs == nil || *in.DeliveryNs != 50_000 {
		t.Fatalf("results.json injection %+v", in)
	}
	if back.Cases[1].Injections[1].ErrorNs != nil {
		t.Fatal("an injection that never fired has no error, not a zero one")
	}
	for _, f := range []string{"report.md", "report.html"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		text := html.UnescapeString(string(b))
		wants := []string{"| `at p + 10ms` | +250 µs | +50 µs |", "| +1.50 ms | +50 µs |", "p50 +250 µs, p99 +1.50 ms"}
		if f == "report.html" {
			wants = []string{"injection error +250 µs (hit delivery +50 µs)", "injection error +1.50 ms (hit delivery +50 µs)"}
		}
		for _, want := range wants {
			if !strings.Contains(text, want) {
				t.Errorf("%s lacks %q", f, want)
			}
		}
	}
}

// TestGateJudgesTimedTriggersOnly: a park's error (the process is held at its
// point) is recorded, not gated.
func TestGateJudgesTimedTriggersOnly(t *testing.T) {
	r := withErrors(run(Pass), 5_000_000)
	r.Cases[0].Injections[0].Trigger = "park snapshot.save.pending"
	FillInjectionErrors(r)
	opt := DefaultGateOptions()
	opt.MaxInjectionError = time.Millisecond
	if g := Gate(r, nil, opt); g.Code != GatePass {
		t.Fatalf("park error gated: %s", g)
	}
	if r.Cases[0].Injections[0].ErrorNs == nil {
		t.Fatal("park error not recorded")
	}
	r.Cases[0].Injections[0].Trigger = "after-exit snapshot-save + 5ms"
	if g := Gate(r, nil, opt); g.Code != GateInconclusive {
		t.Fatalf("after-exit error not gated: %s", g)
	}
}
