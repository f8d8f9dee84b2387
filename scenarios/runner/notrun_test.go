package runner

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/realch"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// TestRealBackendWithoutCHIsListedNotRun: a real case the host cannot run
// (no cloud-hypervisor) keeps its inconclusive verdict and is listed in
// results.json's not_run as a missing binary.
func TestRealBackendWithoutCHIsListedNotRun(t *testing.T) {
	t.Setenv("VMCHAOS_CH_BINARY", filepath.Join(t.TempDir(), "no-such-cloud-hypervisor"))
	r, err := New(context.Background(), Options{ReportDir: t.TempDir(), Backend: "real", Scale: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := scenarios.CaseFor("s001-3-pending-holder", 0, false, "real")
	if err != nil {
		t.Fatal(err)
	}
	rc := r.RunCase(context.Background(), c)
	nr := r.Results().NotRun
	if rc.Verdict != reports.Inconclusive || len(nr) != 1 {
		t.Fatalf("verdict %s, not_run %+v: want inconclusive and one entry", rc.Verdict, nr)
	}
	if nr[0].Case != rc.ID || nr[0].Reason != rc.Reason || nr[0].Kind != reports.MissingBinary || !strings.HasPrefix(nr[0].Missing, "cloud-hypervisor binary") || strings.Contains(nr[0].Missing, "looked in") {
		t.Errorf("not_run entry %+v, want case %s, its reason, a missing cloud-hypervisor binary", nr[0], rc.ID)
	}
}

// TestNoFUSEIsListedNotRun: a power-cut case on a host without FUSE is
// listed not run (a missing host feature); a case that ran is not.
func TestNoFUSEIsListedNotRun(t *testing.T) {
	old := fuseAvailable
	fuseAvailable = func() string { return "FUSE unavailable: open /dev/fuse: no such file or directory" }
	t.Cleanup(func() { fuseAvailable = old })
	r := &Runner{opts: Options{ReportDir: t.TempDir(), Scale: 0.05, Backend: "fake", Lazyfs: true}, res: &reports.Results{}}
	c, err := scenarios.CaseFor("s001-3-pending-holder", 0, false, "fake")
	if err != nil {
		t.Fatal(err)
	}
	rc := r.RunCase(context.Background(), c)
	nr := r.Results().NotRun
	if rc.Culprit != byPrecondition.String() || len(nr) != 1 || nr[0].Kind != reports.MissingHostFeature || !strings.Contains(nr[0].Missing, "FUSE") {
		t.Fatalf("case %s (%s, %q), not_run %+v: want one FUSE host-feature entry", rc.Verdict, rc.Culprit, rc.Reason, nr)
	}
	if _, ok := r.notRunOf(reports.Case{ID: "x", Verdict: reports.Inconclusive, Culprit: byLanding.String()}); ok {
		t.Error("a landing miss was listed as not run")
	}
}

func TestNotRunNeedNamesWhatIsMissing(t *testing.T) {
	for _, tc := range []struct {
		reason, kind, in string
	}{
		{realch.ReasonMissing, reports.MissingBinary, "cloud-hypervisor binary"},
		{realch.ReasonVersion, reports.MissingBinary, "cloud-hypervisor"},
		{realch.ReasonPermission, reports.MissingCapability, "/dev/kvm"},
		{realch.ReasonAbsent, reports.MissingHostFeature, "KVM"},
		{realch.ReasonNestedVirtOff, reports.MissingHostFeature, "nested-virt-off"},
	} {
		n := notRunNeed(realch.PreflightResult{Reason: tc.reason, Detail: "cloud-hypervisor binary (set X; looked in /a (b))"})
		if n.kind != tc.kind || !strings.Contains(n.missing, tc.in) {
			t.Errorf("%s: (%q, %s), want kind %s naming %q", tc.reason, n.missing, n.kind, tc.kind, tc.in)
		}
	}
}

func TestWithoutParens(t *testing.T) {
	in := "cloud-hypervisor binary (set VMCHAOS_CH_BINARY; looked in /usr/bin (x)); guest disk image (set Y)"
	if got, want := withoutParens(in), "cloud-hypervisor binary; guest disk image"; got != want {
		t.Errorf("withoutParens = %q, want %q", got, want)
	}
}

// TestNeedOfEveryPreconditionReason: each precondition names what is
// missing and its kind, the real backend's from the preflight's result.
func TestNeedOfEveryPreconditionReason(t *testing.T) {
	missingCH := realch.PreflightResult{Reason: realch.ReasonMissing, Detail: "cloud-hypervisor binary (set VMCHAOS_CH_BINARY; looked in /usr/bin (x)); guest disk image (set Y)"}
	noKVM := realch.PreflightResult{Reason: "absent", Detail: "no /dev/kvm"}
	nested := "snapshot-needs-nested-state: snapshots need X"
	backend := func(pf realch.PreflightResult) *Runner {
		return &Runner{skip: "real backend unavailable: " + pf.String(), backendNeed: notRunNeed(pf)}
	}
	snapOnly := &Runner{snapSkip: nested, snapNeed: notRunNeed(realch.PreflightResult{Reason: realch.ReasonNestedState})}
	for _, tc := range []struct {
		r             *Runner
		reason        string
		missing, kind string
	}{
		{backend(missingCH), "real backend unavailable: whatever the text", "cloud-hypervisor binary; guest disk image", reports.MissingBinary},
		{backend(realch.PreflightResult{Reason: realch.ReasonVersion, Detail: "30.0"}), "real backend unavailable: …", "cloud-hypervisor of a supported version", reports.MissingBinary},
		{backend(noKVM), "real backend unavailable: absent: no /dev/kvm", "KVM (/dev/kvm: absent)", reports.MissingHostFeature},
		{backend(realch.PreflightResult{Reason: realch.ReasonPermission}), "real backend unavailable: …", "/dev/kvm access for this user", reports.MissingCapability},
		// the backend's need comes first: without it nothing runs
		{&Runner{skip: "x", snapSkip: nested, backendNeed: notRunNeed(noKVM), snapNeed: snapOnly.snapNeed}, "real backend: " + nested + "; also real backend unavailable: absent: no /dev/kvm", "KVM (/dev/kvm: absent)", reports.MissingHostFeature},
		{snapOnly, "real backend: " + nested, "KVM (/dev/kvm: " + realch.ReasonNestedState + ")", reports.MissingHostFeature},
		{&Runner{}, "precondition: FUSE unavailable: open /dev/fuse: ENOENT", "FUSE (/dev/fuse, mounted as root) for lazyfs", reports.MissingHostFeature},
		{&Runner{}, "precondition: net faults: net-delay: tc netem unavailable in this kernel (sch_netem): …", "tc netem (the kernel's sch_netem) for net-delay", reports.MissingHostFeature},
		{&Runner{}, "precondition: something new", "a host precondition", reports.MissingHostFeature},
	} {
		n := tc.r.needOf(tc.reason)
		if n.missing != tc.missing || n.kind != tc.kind {
			t.Errorf("%q: (%q, %s), want (%q, %s)", tc.reason, n.missing, n.kind, tc.missing, tc.kind)
		}
	}
}
