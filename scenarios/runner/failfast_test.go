package runner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/checker"
	"github.com/vmchaos/vmchaos/stackbin"
)

// TestCrashLoopReadsTheAgentLog: three incarnations in a row exiting with
// one fatal error are a crash loop; fewer, different errors, or an
// incarnation that came up in between are not; lines before the offset
// do not count.
func TestCrashLoopReadsTheAgentLog(t *testing.T) {
	p := filepath.Join(t.TempDir(), "nodeagent.log")
	write := func(s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	torn := "Error: intent store: vm-a.json: unexpected end of JSON input\n"
	up := "time=x level=INFO msg=\"nodeagent started\" pid=7\n"
	write(torn + torn)
	if _, n, loop := crashLoop(p, 0); loop || n != 2 {
		t.Fatalf("two exits are not yet a loop: %d %v", n, loop)
	}
	write(torn + torn + torn)
	if msg, n, loop := crashLoop(p, 0); !loop || n != 3 || msg != "intent store: vm-a.json: unexpected end of JSON input" {
		t.Fatalf("three identical exits: %q %d %v", msg, n, loop)
	}
	write(torn + torn + up + torn)
	if _, _, loop := crashLoop(p, 0); loop {
		t.Fatal("an incarnation that came up breaks the run")
	}
	write(torn + "Error: lock state dir: busy\n" + torn)
	if _, _, loop := crashLoop(p, 0); loop {
		t.Fatal("different errors are no loop")
	}
	write(torn + torn + torn + torn)
	if _, _, loop := crashLoop(p, int64(2*len(torn))); loop {
		t.Fatal("exits before the offset count")
	}
	if _, _, loop := crashLoop(filepath.Join(t.TempDir(), "none"), 0); loop {
		t.Fatal("a missing log is no loop")
	}
}

// tornStoreAgent is the planted broken agent: from its third start on (the
// first two are the setup's agent and the armed one; the third is the
// restart after the case's fault; it counts them in VMCHAOS_TEST_STARTS,
// outside the stack's lazy filesystems, which a power cut rolls back) it tears its intent records to ten bytes
// before the real nodeagent reads them, as an intent write that skipped
// its fsync leaves them after a power cut. The real agent then exits with
// "intent store: vm-a.json: unexpected end of JSON input" on every start.
const tornStoreAgent = `#!/bin/sh
state=""; prev=""
for a in "$@"; do
	[ "$prev" = "--state-dir" ] && state="$a"
	case "$a" in --state-dir=*) state="${a#--state-dir=}";; esac
	prev="$a"
done
n=$(cat "$VMCHAOS_TEST_STARTS" 2>/dev/null || echo 0)
n=$((n + 1))
echo "$n" > "$VMCHAOS_TEST_STARTS"
if [ "$n" -ge 3 ]; then
	for f in "$state"/vms/*.json; do
		[ -f "$f" ] && head -c 10 "$f" > "$f.torn" && mv "$f.torn" "$f"
	done
fi
exec %REAL%/nodeagent "$@"
`

// tornStoreBinDir is the stack's binaries with the broken agent.
func tornStoreBinDir(t *testing.T) string {
	t.Helper()
	real, err := stackbin.Dir()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ents, err := os.ReadDir(real)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != "nodeagent" {
			if err := os.Symlink(filepath.Join(real, e.Name()), filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	script := strings.ReplaceAll(tornStoreAgent, "%REAL%", real)
	if err := os.WriteFile(filepath.Join(dir, "nodeagent"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestCrashLoopingAgentFailsFast is issue #37 item 4: an agent that cannot
// start after the fault fails its case for served-after-restart, with the
// crash loop and the agent's own error as the reason, without waiting out
// the 60 s the harness gives an agent to serve again. (How long it took is
// logged and measured in docs/figures.md, never asserted.)
func TestCrashLoopingAgentFailsFast(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts the whole stack; run without -short")
	}
	old := binDir
	t.Cleanup(func() { binDir = old })
	dir := tornStoreBinDir(t)
	binDir = func() (string, error) { return dir, nil }
	// A kill parked mid-clone. The power cut of the example
	// (powercut-create-agent-create-begin, the agent restarted after the cut
	// finds its records torn) ran here too, and once in CI (2026-12-03) its
	// harness thread hung in a FUSE request to the case's state mount
	// (request_wait_answer) with the node SIGSTOPped, until the test
	// timeout: an open harness bug in the power cut with a crash-looping
	// agent (docs/lazyfs.md, Known limits). Until it is fixed it runs only
	// with VMCHAOS_POWERCUT_FAILFAST=1, so make test cannot hang on it.
	ids := []string{"park-vm-clone-reserved-sigkill-main"}
	if os.Getenv("VMCHAOS_POWERCUT_FAILFAST") != "" {
		ids = append(ids, "powercut-create-agent-create-begin")
	}
	for _, id := range ids {
		t.Run(id, func(t *testing.T) {
			t.Setenv("VMCHAOS_TEST_STARTS", filepath.Join(t.TempDir(), "starts"))
			c, err := scenarios.CaseFor(id, 0, false, "fake")
			if err != nil {
				t.Fatal(err)
			}
			if why := fuseAvailable(); why != "" && c.Scenario.Faults[0].Kind == scenarios.FaultPowerCut {
				t.Skip("power cut needs lazyfs: " + why)
			}
			t0 := time.Now()
			rc := runOneCase(t, c)
			t.Logf("broken agent: %s in %s: %s", rc.Verdict, time.Since(t0).Round(time.Millisecond), rc.Reason)
			inv, ok := invariant(rc, ServedAfterRestart)
			if rc.Verdict != reports.Fail || !ok || inv.OK {
				t.Fatalf("want fail on %s, got %s (%s), invariant %+v", ServedAfterRestart, rc.Verdict, rc.Reason, inv)
			}
			for _, want := range []string{"crash-looped past its restart limit", "unexpected end of JSON input"} {
				if !strings.Contains(rc.Reason, want) || !strings.Contains(inv.Evidence, want) {
					t.Errorf("reason and evidence must name %q:\nreason: %s\nevidence: %s", want, rc.Reason, inv.Evidence)
				}
			}
		})
	}
}

// TestTerminalErrorFailsFast: an agent that reports it gave up on an intent
// (its hibernate fails on every attempt, retries exhausted) fails the case
// on intent-goal with the agent's message as the reason, as soon as it
// says so, instead of at the convergence budget.
func TestTerminalErrorFailsFast(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts the whole stack; run without -short")
	}
	c, err := scenarios.CaseFor("s001-5-transient-failed", 0, false, "fake")
	if err != nil {
		t.Fatal(err)
	}
	// the planted broken product: every hibernate attempt fails, not
	// once; with one retry allowed the agent gives up on its second failure
	s := *c.Scenario
	s.Env.Failpoints = "agent.hibernate.begin=error(hibernate broken)@vm=vm-a"
	c.Scenario = &s
	t0 := time.Now()
	rc := runOneCase(t, c)
	t.Logf("giving-up agent: %s in %s: %s", rc.Verdict, time.Since(t0).Round(time.Millisecond), rc.Reason)
	for _, i := range rc.Invariants {
		if !i.OK {
			t.Logf("%s: %s", i.Name, i.Evidence)
		}
	}
	inv, ok := invariant(rc, "intent-goal")
	if rc.Verdict != reports.Fail || !ok || inv.OK {
		t.Fatalf("want fail on intent-goal, got %s (%s), invariant %+v", rc.Verdict, rc.Reason, inv)
	}
	for _, want := range []string{"the agent reported a terminal error for vm-a", retriesExhausted} {
		if !strings.Contains(rc.Reason, want) {
			t.Errorf("the reason must name %q: %s", want, rc.Reason)
		}
	}
	if !strings.Contains(inv.Evidence, retriesExhausted) {
		t.Errorf("the evidence must keep the agent's status: %s", inv.Evidence)
	}
}

// TestTerminalIntent: only a failed intent whose retries the agent says are
// exhausted is terminal; a failure it will retry, or an intent meant to be
// deleted, is not.
func TestTerminalIntent(t *testing.T) {
	in := &checker.Input{Goals: map[string]string{"a": checker.GoalHibernated, "b": checker.GoalDeleted}}
	p := &checker.Poll{Views: map[string]checker.AgentView{
		"a": {Lifecycle: "failed", Message: "hibernate failed (attempt 1): x; retrying in 50ms"},
		"b": {Lifecycle: "failed", Message: "delete failed (attempt 6): x; automatic retries exhausted (5), PUT the intent again to retry"},
	}}
	if got := terminalIntent(in, p); got != "" {
		t.Fatalf("a retried failure and a deleted goal are not terminal: %q", got)
	}
	p.Views["a"] = checker.AgentView{Lifecycle: "failed", Message: "hibernate failed (attempt 2): x; automatic retries exhausted (1), PUT the intent again to retry"}
	if got := terminalIntent(in, p); !strings.Contains(got, "terminal error for a: hibernate failed (attempt 2)") {
		t.Fatalf("exhausted retries are terminal: %q", got)
	}
}
