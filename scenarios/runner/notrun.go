package runner

import (
	"strings"

	"github.com/vmchaos/vmchaos/manager/cocoon"
	"github.com/vmchaos/vmchaos/realch"
	"github.com/vmchaos/vmchaos/reports"
)

// noFUSE starts the reason lazyStack gives (through verdictOf) when lazyfs
// cannot mount.
const noFUSE = "FUSE unavailable"

// need is what a not-run case lacks and its kind (reports.Missing*).
type need struct{ missing, kind string }

// notRunOf is the results' not_run entry of a case the host could not run
// (culprit precondition), ok false for every other case.
func (r *Runner) notRunOf(rc reports.Case) (reports.NotRun, bool) {
	if rc.Culprit != byPrecondition.String() {
		return reports.NotRun{}, false
	}
	n := r.needOf(rc.Reason)
	return reports.NotRun{Case: rc.ID, Reason: rc.Reason, Missing: n.missing, Kind: n.kind}, true
}

// needOf names what a precondition reason says is missing. The real
// backend's needs were taken from the preflight's own result in New, not
// read back from the reason text: without the backend nothing runs, so its
// need comes first, then the snapshot one.
func (r *Runner) needOf(reason string) need {
	switch {
	case strings.HasPrefix(strings.TrimPrefix(reason, "precondition: "), noFUSE):
		return need{"FUSE (/dev/fuse, mounted as root) for lazyfs", reports.MissingHostFeature}
	case strings.HasPrefix(strings.TrimPrefix(reason, "precondition: "), guestNetPrefix):
		return guestNetNeed(reason)
	case strings.Contains(reason, "sch_netem"):
		return need{"tc netem (the kernel's sch_netem) for net-delay", reports.MissingHostFeature}
	case r.skip != "":
		return r.backendNeed
	case r.snapSkip != "" && strings.Contains(reason, r.snapSkip):
		return r.snapNeed
	}
	return need{"a host precondition", reports.MissingHostFeature}
}

// guestNetNeed is what a workload case's guest network lacks, from the
// adapter's reason (cocoon.NetPreflight's words).
func guestNetNeed(reason string) need {
	switch {
	case strings.Contains(reason, cocoon.CNIPackage):
		return need{cocoon.CNIPackage + " (" + strings.Join(cocoon.CNIPlugins, ", ") + ")", reports.MissingBinary}
	case strings.Contains(reason, "needs root"):
		return need{"root", reports.MissingCapability}
	}
	return need{"a guest network the harness reaches", reports.MissingHostFeature}
}

// notRunNeed is what the real backend's preflight found missing: the
// binary or host feature its reason names (realch's Reason words).
func notRunNeed(pf realch.PreflightResult) need {
	switch pf.Reason {
	case realch.ReasonMissing:
		// the detail without where discovery looked (the reason keeps it)
		return need{withoutParens(pf.Detail), reports.MissingBinary}
	case realch.ReasonVersion:
		return need{"cloud-hypervisor of a supported version", reports.MissingBinary}
	case realch.ReasonPermission:
		return need{"/dev/kvm access for this user", reports.MissingCapability}
	default:
		return need{"KVM (/dev/kvm: " + pf.Reason + ")", reports.MissingHostFeature}
	}
}

// withoutParens drops every parenthesised part of s (nested ones too) and
// the spaces before it: "ch binary (set X; looked in …); image (…)" →
// "ch binary; image".
func withoutParens(s string) string {
	var b strings.Builder
	depth := 0
	for _, r := range s {
		switch {
		case r == '(':
			depth++
		case r == ')' && depth > 0:
			depth--
		case depth == 0:
			b.WriteRune(r)
		}
	}
	return strings.Join(strings.Fields(strings.ReplaceAll(b.String(), " ;", ";")), " ")
}
