package runner

import (
	"strings"

	"github.com/vmchaos/vmchaos/realch"
	"github.com/vmchaos/vmchaos/reports"
)

// notRunNeed is what the real backend's preflight found missing: the
// binary or host feature its reason names (realch's Reason words).
func notRunNeed(pf realch.PreflightResult) (missing, kind string) {
	switch pf.Reason {
	case realch.ReasonMissing:
		// the detail without where discovery looked (the reason keeps it)
		return withoutParens(pf.Detail), reports.MissingBinary
	case realch.ReasonVersion:
		return "cloud-hypervisor of a supported version", reports.MissingBinary
	case realch.ReasonPermission:
		return "/dev/kvm access for this user", reports.MissingCapability
	default:
		return "KVM (/dev/kvm: " + pf.Reason + ")", reports.MissingHostFeature
	}
}

// notRunOf is the results' not_run entry of a case the host could not run
// (culprit precondition), ok false for every other case. The only
// preconditions are the real backend's preflight (r.skip) and a FUSE mount
// for lazyfs (lazyStack).
func (r *Runner) notRunOf(rc reports.Case) (reports.NotRun, bool) {
	if rc.Culprit != byPrecondition.String() {
		return reports.NotRun{}, false
	}
	n := reports.NotRun{Case: rc.ID, Reason: rc.Reason, Missing: r.skipMissing, Kind: r.skipKind}
	if r.skip == "" {
		n.Missing, n.Kind = "FUSE (/dev/fuse, mounted as root) for lazyfs", reports.MissingHostFeature
	}
	return n, true
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
