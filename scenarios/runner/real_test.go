package runner

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/realch"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/stack"
)

// TestRealBackendWithoutCHIsInconclusive: where discovery finds no
// cloud-hypervisor, every real case is inconclusive with the preflight's
// own words (what is missing and where it looked), nothing is started, and
// the report names the supervisor auto chose for the real backend.
func TestRealBackendWithoutCHIsInconclusive(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-cloud-hypervisor")
	t.Setenv("VMCHAOS_CH_BINARY", missing)
	_, pf, pfErr := realch.Preflight(realch.Options{})
	if !errors.Is(pfErr, realch.ErrMissing) {
		t.Fatalf("preflight with %s: %v, want missing", missing, pfErr)
	}
	r, err := New(context.Background(), Options{ReportDir: t.TempDir(), Backend: "real", Scale: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.run != nil {
		t.Fatal("a stack run was built without a cloud-hypervisor")
	}
	c, err := scenarios.CaseFor("s001-3-pending-holder", 0, false, "real")
	if err != nil {
		t.Fatal(err)
	}
	rc := r.RunCase(context.Background(), c)
	want := "real backend unavailable: " + pfErr.Error()
	if pf.Snapshot != "" { // a save: on a host without KVM_CAP_NESTED_STATE its snapshot reason comes first
		want = "real backend: " + pf.Snapshot + "; also " + want
	}
	if rc.Verdict != reports.Inconclusive || rc.Reason != want || !strings.Contains(rc.Reason, missing) {
		t.Fatalf("%s (%q), want inconclusive with %q", rc.Verdict, rc.Reason, want)
	}
	if rc.Supervisor != injector.KindBuiltin || r.Results().Supervisor != "builtin ("+realAutoNote+")" || r.SupervisorNote() != realAutoNote {
		t.Errorf("case supervisor %q, run %q, note %q", rc.Supervisor, r.Results().Supervisor, r.SupervisorNote())
	}
}

// TestRealBackendBuildsTheRun: once the preflight passes, New builds the
// stack run for the real backend (no more "not wired" skip) with a
// supervisor that sees the host's /run/netns: auto becomes builtin with a
// note, builtin and systemd stay, sandbox is refused before anything runs.
// The preflight's failure reasons still skip.
func TestRealBackendBuildsTheRun(t *testing.T) {
	oldPF, oldBin, oldRun := preflight, binDir, newRun
	t.Cleanup(func() { preflight, binDir, newRun = oldPF, oldBin, oldRun })
	pf := realch.PreflightResult{OK: true, Reason: "ok", Detail: "KVM API 12"}
	preflight = func(realch.Options) (*realch.Env, realch.PreflightResult, error) { return &realch.Env{}, pf, nil }
	binDir = func() (string, error) { return "/stack-bin", nil }
	var got []stack.RunOptions
	stop := errors.New("stop before anything starts")
	newRun = func(_ context.Context, o stack.RunOptions) (*stack.Run, error) {
		got = append(got, o)
		return nil, stop
	}
	ctx := context.Background()
	for _, tc := range []struct{ asked, want, note string }{
		{"auto", injector.KindBuiltin, realAutoNote},
		{"", injector.KindBuiltin, realAutoNote},
		{"builtin", injector.KindBuiltin, ""},
		{"systemd", injector.KindSystemd, ""},
	} {
		got = nil
		_, err := New(ctx, Options{ReportDir: t.TempDir(), Backend: "real", Supervisor: tc.asked, Scale: 0.05, Seed: 4})
		if !errors.Is(err, stop) || len(got) != 1 {
			t.Fatalf("supervisor %q: New = %v after %d NewRun call(s), want the run built", tc.asked, err, len(got))
		}
		o := got[0]
		if o.Backend != stack.BackendReal || o.Supervisor != tc.want || o.BinDir != "/stack-bin" || o.Scale != 0.05 || o.Seed != 4 {
			t.Errorf("supervisor %q: NewRun options %+v, want backend real, supervisor %s", tc.asked, o, tc.want)
		}
		if kind, note, err := realSupervisor(tc.asked); kind != tc.want || note != tc.note || err != nil {
			t.Errorf("realSupervisor(%q) = %q, %q, %v; want %q, %q", tc.asked, kind, note, err, tc.want, tc.note)
		}
	}

	got = nil
	if _, err := New(ctx, Options{ReportDir: t.TempDir(), Backend: "real", Supervisor: "sandbox"}); err == nil || !strings.Contains(err.Error(), "/run/netns") || len(got) != 0 {
		t.Errorf("sandbox: New = %v after %d NewRun call(s), want a refusal naming /run/netns", err, len(got))
	}

	// The fake backend keeps the asked supervisor (auto may pick the
	// sandbox there) and gets no note.
	got = nil
	if _, err := New(ctx, Options{ReportDir: t.TempDir(), Supervisor: "auto"}); !errors.Is(err, stop) || len(got) != 1 ||
		got[0].Backend != "fake" || got[0].Supervisor != "auto" {
		t.Errorf("fake: New = %v, options %+v", err, got)
	}

	pf = realch.PreflightResult{Reason: "nested-virt-off", Detail: "no vmx/svm in a guest"}
	got = nil
	r, err := New(ctx, Options{ReportDir: t.TempDir(), Backend: "real"})
	if err != nil || len(got) != 0 || r.skip != "real backend unavailable: "+pf.String() {
		t.Fatalf("preflight %v: New = %v, %d NewRun call(s), skip %q", pf, err, len(got), r.skip)
	}
}
