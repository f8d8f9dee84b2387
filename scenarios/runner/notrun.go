package runner

import (
	"strings"

	"github.com/vmchaos/vmchaos/realch"
	"github.com/vmchaos/vmchaos/reports"
)

// Prefixes of the reasons a case the host cannot run is given: the real
// backend's preflight (New: "real backend unavailable: " + its result or
// error; per case "real backend: " + a snapshot reason) and the lazyfs
// mount (lazyStack, through verdictOf: "precondition: FUSE unavailable: …").
const (
	realUnavailable = "real backend unavailable: "
	realCaseSkip    = "real backend: "
	noFUSE          = "FUSE unavailable"
)

// notRunOf is the results' not_run entry of a case the host could not run
// (culprit precondition), ok false for every other case.
func (r *Runner) notRunOf(rc reports.Case) (reports.NotRun, bool) {
	if rc.Culprit != byPrecondition.String() {
		return reports.NotRun{}, false
	}
	missing, kind := missingOf(rc.Reason)
	return reports.NotRun{Case: rc.ID, Reason: rc.Reason, Missing: missing, Kind: kind}, true
}

// missingOf names what a precondition reason says is missing, and its kind.
func missingOf(reason string) (string, string) {
	why := strings.TrimPrefix(reason, "precondition: ")
	// a per-case skip names the backend's own reason last ("…; also real
	// backend unavailable: …"): without the backend nothing runs, so that
	// one is what is missing first
	_, backend, unavailable := strings.Cut(why, realUnavailable)
	switch {
	case strings.HasPrefix(why, noFUSE):
		return "FUSE (/dev/fuse, mounted as root) for lazyfs", reports.MissingHostFeature
	case unavailable:
		return notRunNeed(preflightOf(backend))
	case strings.HasPrefix(why, realCaseSkip):
		first, _, _ := strings.Cut(strings.TrimPrefix(why, realCaseSkip), ";")
		return notRunNeed(preflightOf(first))
	}
	return "a host precondition", reports.MissingHostFeature
}

// preflightOf reads back the preflight result a reason was made from: its
// String ("<reason word>: <detail>") or Preflight's discovery error
// ("realch: missing: …", "realch: … version …").
func preflightOf(s string) realch.PreflightResult {
	if rest, ok := strings.CutPrefix(s, "realch: "); ok {
		if items, ok := strings.CutPrefix(rest, "missing: "); ok {
			return realch.PreflightResult{Reason: realch.ReasonMissing, Detail: items}
		}
		return realch.PreflightResult{Reason: realch.ReasonVersion, Detail: rest}
	}
	word, detail, _ := strings.Cut(s, ": ")
	return realch.PreflightResult{Reason: word, Detail: detail}
}

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
