package reports

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Injection error: how far from its request a fault landed. Every injection
// with both times carries it (ErrorNs = ActualNs − RequestedNs) and, when a
// trace hit triggered it, the hit's delivery (DeliveryNs = when the harness
// read the hit − the emitter's stamp), so each case shows its own accuracy.

// FillInjectionErrors sets ErrorNs on every injection that has both times and
// no ErrorNs yet; WriteAll calls it, so every writer of results gets it.
func FillInjectionErrors(r *Results) {
	for ci := range r.Cases {
		for ii := range r.Cases[ci].Injections {
			in := &r.Cases[ci].Injections[ii]
			if in.ErrorNs == nil && in.RequestedNs > 0 && in.ActualNs > 0 {
				e := in.ActualNs - in.RequestedNs
				in.ErrorNs = &e
			}
		}
	}
}

// Timed reports whether the injection's trigger is a point + offset (`at`,
// `after-exit`), the triggers whose timing decides where the fault lands. A
// `park` holds the process at its point and `now` has no phase to hit: their
// error is recorded, not gated.
func (in Injection) Timed() bool {
	return strings.HasPrefix(in.Trigger, "at ") || strings.HasPrefix(in.Trigger, "after-exit ")
}

// InjectionErrors returns every measured error of a timed injection (see
// Timed) of the run (ns), sorted, with the case each came from.
func InjectionErrors(r *Results) (errs []int64, cases []string) {
	type e struct {
		ns int64
		id string
	}
	var all []e
	for _, c := range r.Cases {
		for _, in := range c.Injections {
			if in.ErrorNs != nil && in.Timed() {
				all = append(all, e{*in.ErrorNs, c.ID})
			}
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].ns < all[j].ns })
	for _, x := range all {
		errs, cases = append(errs, x.ns), append(cases, x.id)
	}
	return errs, cases
}

// nearestRank is the p-quantile (0 < p ≤ 1) of sorted xs by nearest rank.
func nearestRank(xs []int64, p float64) int64 {
	i := int(p*float64(len(xs))+0.999999999) - 1
	return xs[max(0, min(i, len(xs)-1))]
}

// injectionErrorGate: the run is inconclusive when the p99 of its injection
// errors exceeds max: its faults did not land when the report says they did.
// A late fault is as much a different experiment as an early one, so the
// magnitude is judged.
func injectionErrorGate(r *Results, limit time.Duration) (string, bool) {
	errs, cases := InjectionErrors(r)
	if len(errs) == 0 {
		return "", true
	}
	abs := make([]int64, len(errs))
	worst := 0
	for i, e := range errs {
		abs[i] = max(e, -e)
		if abs[i] > abs[worst] {
			worst = i
		}
	}
	sort.Slice(abs, func(i, j int) bool { return abs[i] < abs[j] })
	p99 := nearestRank(abs, 0.99)
	if time.Duration(p99) <= limit {
		return "", true
	}
	return fmt.Sprintf("INCONCLUSIVE injection error p99 %s over %d timed injection(s) exceeds --max-injection-error %s (worst %s in %s): faults did not land when requested",
		fmtNs(p99), len(errs), limit, fmtNs(errs[worst]), cases[worst]), false
}

// fmtNs shows an injection error or delay: signed, µs below a millisecond.
func fmtNs(ns int64) string {
	if ns > -1e6 && ns < 1e6 {
		return fmt.Sprintf("%+d µs", ns/1e3)
	}
	return fmt.Sprintf("%+.2f ms", float64(ns)/1e6)
}

// injectionErrorText is the error part of a report's injection line.
func injectionErrorText(inj Injection) string {
	e := inj.ErrorNs
	if e == nil && inj.RequestedNs > 0 && inj.ActualNs > 0 {
		x := inj.ActualNs - inj.RequestedNs
		e = &x
	}
	if e == nil {
		return ""
	}
	s := ", injection error " + fmtNs(*e)
	switch {
	case inj.InVictim:
		s += " (armed in the victim)"
	case inj.DeliveryNs != nil:
		s += " (hit delivery " + fmtNs(*inj.DeliveryNs) + ")"
	}
	return s
}

// mdInjectionErrors is report.md's "Injection accuracy" section: the run's
// error distribution, then every case's own injections.
func mdInjectionErrors(b *strings.Builder, r *Results) {
	errs, _ := InjectionErrors(r)
	if len(errs) == 0 {
		return
	}
	abs := make([]int64, len(errs))
	for i, e := range errs {
		abs[i] = max(e, -e)
	}
	sort.Slice(abs, func(i, j int) bool { return abs[i] < abs[j] })
	b.WriteString("## Injection accuracy\n\n")
	fmt.Fprintf(b, "|actual − requested| over %d timed (`at`, `after-exit`) injection(s): p50 %s, p99 %s, max %s.\n\n", len(abs),
		fmtNs(nearestRank(abs, .5)), fmtNs(nearestRank(abs, .99)), fmtNs(abs[len(abs)-1]))
	b.WriteString("| case | fault | trigger | injection error | hit delivery |\n|---|---|---|---|---|\n")
	for _, c := range r.Cases {
		for _, in := range c.Injections {
			if in.ErrorNs == nil {
				continue
			}
			del := "-"
			switch {
			case in.InVictim:
				del = "armed in the victim"
			case in.DeliveryNs != nil:
				del = fmtNs(*in.DeliveryNs)
			}
			fmt.Fprintf(b, "| %s | %s | `%s` | %s | %s |\n", mdCaseLink(c), mdEscape(in.Fault), mdCode(in.Trigger), fmtNs(*in.ErrorNs), del)
		}
	}
	b.WriteString("\n")
}
