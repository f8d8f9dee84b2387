package reports

import (
	"fmt"
	"strings"
)

// ReproLowPercent is the reproduction rate under which a finding is called
// hard to reproduce and its report shows what varied between the runs and
// the park point that would pin it (issue #36 item 2).
const ReproLowPercent = 95

// ReproRate is how often a failing case's outcome (its verdict and the
// set of invariants it violated, Outcome) came again when `vmchaos run
// --repro-check N` ran the case N more times, each on a fresh stack.
type ReproRate struct {
	Outcome    string         `json:"outcome"`    // the run's own outcome, the one to reproduce
	Asked      int            `json:"asked"`      // N
	Runs       int            `json:"runs"`       // reruns done (fewer when interrupted)
	Reproduced int            `json:"reproduced"` // reruns with the same outcome
	Outcomes   []ReproOutcome `json:"outcomes"`   // every outcome of the reruns, most common first
	// Varied says what differed between the run and its reruns (landed
	// phase, window margin, injection error), for a rate under
	// ReproLowPercent; Suggest is the park point that pins the failure,
	// where one exists, or why there is none.
	Varied  string `json:"varied,omitempty"`
	Suggest string `json:"suggest,omitempty"`
	Dir     string `json:"dir,omitempty"` // the reruns' run dir, relative to this run's
}

// ReproOutcome is one outcome of the reruns and how many had it.
type ReproOutcome struct {
	Outcome string `json:"outcome"`
	Runs    int    `json:"runs"`
}

// MeasureRepro compares each rerun's outcome with the failing run's.
// Varied is filled in when the rate is under ReproLowPercent.
func MeasureRepro(orig Case, reruns []Case, asked int) *ReproRate {
	r := &ReproRate{Outcome: Outcome(orig), Asked: asked, Runs: len(reruns)}
	for _, o := range TallyOutcomes(reruns) {
		r.Outcomes = append(r.Outcomes, ReproOutcome{Outcome: o.Outcome, Runs: len(o.Runs)})
		if o.Outcome == r.Outcome {
			r.Reproduced = len(o.Runs)
		}
	}
	if r.Low() {
		r.Varied = reproVaried(append([]Case{orig}, reruns...))
	}
	return r
}

// Low: the failure reproduced in under ReproLowPercent of the reruns (or
// none ran), so the report says what varied.
func (r *ReproRate) Low() bool { return r.Runs == 0 || r.Reproduced*100 < ReproLowPercent*r.Runs }

// Label is "18/20 (90%)", or what stopped the reruns short.
func (r *ReproRate) Label() string {
	s := fmt.Sprintf("%d/%d (%s)", r.Reproduced, r.Runs, percent(r.Reproduced, r.Runs))
	if r.Runs < r.Asked {
		s += fmt.Sprintf(", %d of %d rerun(s) done (interrupted)", r.Runs, r.Asked)
	}
	return s
}

// OthersLabel lists the outcomes other than the one reproduced: "pass ×2".
func (r *ReproRate) OthersLabel() string {
	var parts []string
	for _, o := range r.Outcomes {
		if o.Outcome != r.Outcome {
			parts = append(parts, fmt.Sprintf("%s ×%d", o.Outcome, o.Runs))
		}
	}
	return strings.Join(parts, ", ")
}

// reproMarkdown is a failing case's reproduction rate in report.md.
func reproMarkdown(b *strings.Builder, c Case) {
	r := c.ReproRate
	if r == nil {
		return
	}
	fmt.Fprintf(b, "\nReproduction rate (`--repro-check %d`): **%s** reproduced `%s`", r.Asked, r.Label(), mdCode(r.Outcome))
	if o := r.OthersLabel(); o != "" {
		fmt.Fprintf(b, "; otherwise %s", mdEscape(o))
	}
	b.WriteString("\n")
	if r.Low() && r.Varied != "" {
		fmt.Fprintf(b, "\nUnder %d %%, what varied between the run and its reruns:\n\n%s", ReproLowPercent, codeBlock("", r.Varied))
	}
	if r.Suggest != "" {
		fmt.Fprintf(b, "\nPark point that pins it: %s\n", mdEscape(r.Suggest))
	}
}
