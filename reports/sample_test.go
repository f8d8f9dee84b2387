package reports

import (
	"fmt"
	"time"
)

// hostile is text that breaks naive XML, HTML and Markdown writers.
const hostile = "<script>alert('x')</script> ]]> & \"q\" | pipe `tick` *star* \x01ctl"

// sampleResults builds a realistic run: park cases, an offset sweep of two
// scenarios, one failure with two violated invariants, an inconclusive case,
// a harness error and a flaky pass, each with a timeline.
func sampleResults() *Results {
	start := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	r := &Results{
		RunID: "20261130-020000-abcd", StartedAt: start, FinishedAt: start.Add(93 * time.Second),
		Host: "ci-runner-3", Backend: "fake", Supervisor: "builtin", TimeScale: 0.05, Seed: 42,
		Filter: "speed:fast",
	}
	base := int64(5_000_000_000)
	mk := func(scen string, off float64, park string) Case {
		id := fmt.Sprintf("%s@%gms", scen, off)
		trig := fmt.Sprintf("at vm.clone.reserved + %gms", off)
		if park != "" {
			id = scen + "/park:" + park
			trig = "park " + park
		}
		t0 := base + int64(len(r.Cases))*1_000_000_000
		c := Case{
			ID: id, Scenario: scen, Title: "agent SIGKILLed while " + scen + " is in flight", SeedRef: "001",
			Labels:  []string{"backend:fake", "op:clone", "fault:sigkill-main", "seed:001", "speed:fast"},
			Backend: "fake", Supervisor: "builtin", TimeScale: 0.05, Seed: 42, Operation: "clone", Fault: "sigkill-main",
			Trigger: trig, OffsetMs: off, LandedPhase: "vm.clone.files-copied", StartedAt: start, DurationMs: 2400,
			ConvergeMs: 300 + off*3, Verdict: Pass, Attempts: 1,
			Repro:      fmt.Sprintf("vmchaos repro --scenario %s --offset %g --seed 42 --time-scale 0.05 --backend fake", scen, off),
			Logs:       map[string]string{"nodeagent": "cases/" + id + "/nodeagent.log", "trace": "cases/" + id + "/trace.jsonl"},
			Invariants: []Invariant{{Name: "intent-goal", OK: true}, {Name: "one-vm-per-name", OK: true}, {Name: "ledger-clean", OK: true}},
			Injections: []Injection{{Fault: "sigkill-main", Trigger: trig, RequestedNs: t0 + 100_000_000, ActualNs: t0 + 100_400_000,
				VictimPID: 4242, LastPhase: "vm.clone.files-copied", IntendedPhase: "vm.clone.files-copied", Landed: true}},
			Ledger:  []LedgerVerdict{{Guest: "vm-a", Stable: 3, OK: true}},
			Metrics: map[string]float64{`nodeagent_stale_create_reconcile_total{outcome="collected"}`: 1},
			Timeline: []TimelineEvent{
				{TsNs: t0, Kind: "phase", Proc: "nodeagent", Point: "agent.create.begin", VM: "vm-a"},
				{TsNs: t0 + 20_000_000, Kind: "phase", Proc: "vmctl", Point: "vm.clone.reserved", VM: "vm-a"},
				{TsNs: t0 + 60_000_000, Kind: "phase", Proc: "vmctl", Point: "vm.clone.files-copied", VM: "vm-a"},
				{TsNs: t0 + 100_400_000, Kind: "fault", Proc: "nodeagent", Point: "agent.create.begin", Note: "sigkill-main pid 4242"},
				{TsNs: t0 + 350_000_000, Kind: "restart", Proc: "nodeagent", Note: "unit restarted"},
				{TsNs: t0 + 360_000_000, Kind: "phase", Proc: "nodeagent", Point: "agent.started"},
				{TsNs: t0 + 100_400_000 + int64((300+off*3)*1e6), Kind: "converged"},
			},
		}
		return c
	}
	for _, p := range []string{"vm.clone.reserved", "vm.clone.files-copied"} {
		r.Cases = append(r.Cases, mk("clone-park", 0, p))
	}
	for _, off := range []float64{0, 25, 50, 75, 100} {
		r.Cases = append(r.Cases, mk("clone-sigkill-sweep", off, ""))
		r.Cases = append(r.Cases, mk("save-stop-sweep", off, ""))
	}
	// A failure with two violated invariants and hostile evidence.
	f := &r.Cases[4]
	f.Verdict, f.ConvergeMs = Fail, -1
	f.Invariants[0] = Invariant{Name: "intent-goal", OK: false, Evidence: "vm-a: lifecycle failed (want ready) after 30s\n" + hostile}
	f.Invariants[1] = Invariant{Name: "one-vm-per-name", OK: false, Evidence: "name vm-a held by 2 records: 01AAA, 01BBB"}
	f.Ledger[0] = LedgerVerdict{Guest: "vm-a", Stable: 2, Lost: 1, LostNames: []string{"m-0003"}, OK: false, Message: "acked marker missing"}
	// The fault missed its phase.
	in := &r.Cases[7]
	in.LandedPhase = "vm.clone.committed"
	in.Verdict, in.Reason = Inconclusive, "fault landed in vm.clone.committed, intended vm.clone.files-copied"
	in.Injections[0].Landed, in.Injections[0].LastPhase = false, "vm.clone.committed"
	// The harness broke.
	e := &r.Cases[9]
	e.Verdict, e.Reason, e.ConvergeMs = Error, "trace socket: "+hostile, -1
	for _, c := range []*Case{f, e} {
		c.Timeline = c.Timeline[:len(c.Timeline)-1] // never converged
	}
	// Passed on the second attempt.
	r.Cases[10].Attempts = 2
	return r
}
