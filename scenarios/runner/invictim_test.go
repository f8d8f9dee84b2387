package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// TestFastCasesArmTheirFaultInTheVictim runs two fast cases on the whole
// stack (builtin supervisor) and reads their results.json back: the vmctl
// clone child that hits vm.clone.reserved kills itself (sigkill-child in the
// victim) while the agent, which does not hit it, is killed from the harness;
// the harness's own direct clone kills itself (sigkill-direct). Each armed
// fault carries in_victim and its own error_ns, and both cases pass — so the
// restarted agent's recreated clone, which inherits the same one-shot spec,
// did not die again (that would be an unexpected restart or a lost VM).
func TestFastCasesArmTheirFaultInTheVictim(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts the whole stack; run without -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	r, err := New(ctx, Options{ReportDir: dir, Supervisor: "builtin", Scale: 0.05, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, id := range []string{"s002-clone-sigkill-59ms-agent", "s002-clone-sigkill-59ms-daemon"} {
		c, err := scenarios.CaseFor(id, 0, false, "fake")
		if err != nil {
			t.Fatal(err)
		}
		if rc := r.RunCase(ctx, c); rc.Verdict != reports.Pass {
			t.Fatalf("%s: %s (%s)", rc.ID, rc.Verdict, rc.Reason)
		}
	}
	if _, err := r.WriteAll(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Cases []struct {
			ID         string
			Injections []map[string]any `json:"injections"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"sigkill-child": true, "sigkill-main": false, "sigkill-direct": true} // fault → in the victim
	seen := 0
	for _, c := range res.Cases {
		for _, in := range c.Injections {
			fault, _ := in["fault"].(string)
			kind, _, _ := strings.Cut(fault, " ")
			inV, ok := want[kind]
			if !ok {
				t.Fatalf("%s: unexpected fault %q", c.ID, fault)
			}
			seen++
			got, _ := in["in_victim"].(bool)
			errNs, hasErr := in["error_ns"].(float64)
			if got != inV || !hasErr || in["landed"] != true {
				t.Errorf("%s %s: in_victim %v (want %v), error_ns %v, landed %v: %v", c.ID, fault, got, inV, in["error_ns"], in["landed"], in)
			}
			// The victim never fires before its due time (late_ns ≥ 0).
			if inV && errNs < 0 {
				t.Errorf("%s %s: error_ns %v < 0 in the victim", c.ID, fault, errNs)
			}
		}
	}
	if seen != 3 {
		t.Fatalf("%d injections in results.json, want 3", seen)
	}
	// One-shot: the agent's recreated clone hit vm.clone.reserved again
	// after the fault, with the same spec in its environment, and fired
	// nothing; one failpoint.signal per case.
	for _, c := range res.Cases {
		b, err := os.ReadFile(filepath.Join(dir, "cases", c.ID, "trace.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		var signals, rehits int
		var firedNs float64
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var e map[string]any
			if err := json.Unmarshal([]byte(line), &e); err != nil {
				t.Fatal(err)
			}
			switch ts, _ := e["ts_ns"].(float64); {
			case e["point"] == "failpoint.signal":
				signals++
				firedNs = ts
			case e["point"] == "vm.clone.reserved" && firedNs > 0 && ts > firedNs:
				rehits++
			}
		}
		if signals != 1 {
			t.Errorf("%s: %d failpoint.signal datagrams, want 1", c.ID, signals)
		}
		if strings.Contains(c.ID, "-agent") && rehits == 0 {
			t.Errorf("%s: no vm.clone.reserved after the fault: the recreate that must not fire again never came", c.ID)
		}
	}
	if left := leftovers(r); len(left) > 0 {
		t.Fatalf("processes left: %v", left)
	}
}

// TestDirectHostOfAGoneOrStartingVmctl: a harness vmctl that killed itself
// (gone from /proc) is still known by its recorded pids, and one whose
// start is not recorded yet, or whose pids are not learnt yet, is waited
// for; a stranger is refused. pid 1<<22+7 is above any pid_max this runs under, so /proc never
// has it: only the record can answer.
func TestDirectHostOfAGoneOrStartingVmctl(t *testing.T) {
	const gone = 1<<22 + 7
	cr := &caseRun{direct: map[string]*directProc{"a": {pid: gone, self: gone, host: gone}}}
	if host, err := cr.directHost(gone); err != nil || host != gone {
		t.Fatalf("recorded, gone: %d, %v", host, err)
	}
	if _, err := cr.directHost(gone + 1); err == nil {
		t.Fatal("a pid nobody started was taken for the harness's")
	}
	// One starting: directHost waits until it is recorded.
	cr.starting = 1
	done := make(chan error, 1)
	go func() {
		host, err := cr.directHost(gone + 1)
		if err == nil && host != gone+2 {
			err = fmt.Errorf("host %d, want %d", host, gone+2)
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("answered before the start was recorded: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	// Recorded, but a sandboxed one whose pids are not learnt yet: still waits.
	b := &directProc{pid: gone + 2}
	cr.mu.Lock()
	cr.starting--
	cr.direct["b"] = b
	cr.directChanged()
	cr.mu.Unlock()
	select {
	case err := <-done:
		t.Fatalf("answered before the pids were learnt: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	cr.mu.Lock()
	b.self, b.host = gone+1, gone+2
	cr.directChanged()
	cr.mu.Unlock()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("never answered once the start was recorded")
	}
}
