package runner

import (
	"context"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/realch"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

const nestedReason = realch.ReasonNestedState + ": cloud-hypervisor v53.0 (≥ v49, PR #7380) calls KVM_GET_NESTED_STATE, which this kvm_pvm host does not support (KVM_CAP_NESTED_STATE = 0)"

// On a host that cannot take a snapshot, the snapshot operations' cells
// carry the nested-state reason, the others the backend's reason (or none
// where the backend runs), and every cell stays in the denominator.
func TestSnapshotCellsCarryTheNestedStateReason(t *testing.T) {
	saved := fuseAvailable
	defer func() { fuseAvailable = saved }()
	fuseAvailable = func() string { return "" }
	all := len(scenarios.CoverageCells())
	for _, tc := range []struct {
		name, skip, snapWant, otherWant string
	}{
		{"kvm-pvm boot and snapshot", "real backend unavailable: kvm-pvm: stock kernels die", "real backend: " + nestedReason + "; also real backend unavailable: kvm-pvm: stock kernels die", "real backend unavailable: kvm-pvm: stock kernels die"},
		{"PVM guest kernel boots", "", "real backend: " + nestedReason, ""},
	} {
		r := &Runner{skip: tc.skip, snapSkip: nestedReason}
		cov := MatrixCoverage(nil, r.notRunnable)
		if cov.Applicable != all {
			t.Fatalf("%s: %d cells, want all %d", tc.name, cov.Applicable, all)
		}
		snap, other := 0, 0
		for _, c := range cov.Cells {
			want := tc.otherWant
			if scenarios.OpNeedsSnapshot(c.Op) {
				want = tc.snapWant
				snap++
			} else {
				other++
			}
			if c.NotRunnable != want {
				t.Errorf("%s: %s %s × %s marked %q, want %q", tc.name, c.Op, c.Point, c.Kind, c.NotRunnable, want)
			}
		}
		if snap == 0 || other == 0 {
			t.Fatalf("%s: %d snapshot cells, %d others: the table must have both", tc.name, snap, other)
		}
		if got := cov.NotRunnableReasons()[tc.snapWant]; got != snap {
			t.Errorf("%s: %d cells counted with the nested-state reason, want %d", tc.name, got, snap)
		}
	}
}

// A real-backend run on such a host: cases that need a snapshot are
// inconclusive with the nested-state reason (the boot reason kept after
// it), the others with the boot reason alone.
func TestSnapshotCasesCarryTheNestedStateReason(t *testing.T) {
	oldPF := preflight
	t.Cleanup(func() { preflight = oldPF })
	pf := realch.PreflightResult{Reason: realch.ReasonPVM, Detail: "kvm_pvm", Snapshot: nestedReason}
	preflight = func(realch.Options) (*realch.Env, realch.PreflightResult, error) { return &realch.Env{}, pf, nil }
	r, err := New(context.Background(), Options{ReportDir: t.TempDir(), Backend: "real", Scale: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	boot := "real backend unavailable: " + pf.String()
	seen := map[bool]int{}
	cases, err := scenarios.Expand("real")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		if seen[scenarios.NeedsSnapshot(c.Scenario)] >= 3 {
			continue
		}
		rc := r.RunCase(context.Background(), c)
		want := boot
		if scenarios.NeedsSnapshot(c.Scenario) {
			want = "real backend: " + nestedReason + "; also " + boot
		}
		if rc.Verdict != reports.Inconclusive || rc.Reason != want {
			t.Errorf("%s (op %s): %s %q, want inconclusive %q", c.ID, c.Scenario.Op, rc.Verdict, rc.Reason, want)
		}
		seen[scenarios.NeedsSnapshot(c.Scenario)]++
	}
	if seen[true] == 0 || seen[false] == 0 {
		t.Fatalf("cases run: %v; want both snapshot and other cases", seen)
	}
	if !strings.HasPrefix(r.Results().Cases[0].Reason, "real backend") {
		t.Errorf("first case reason %q", r.Results().Cases[0].Reason)
	}
}
