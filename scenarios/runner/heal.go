package runner

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// Every registry fault heals before the final check, and a case whose heal
// the harness times says how long the node took to converge after it
// (reports.Case.ConvergeAfterHealMs): registry-storage-full heals when the
// injector gives the storage back (the disk stamps it), registry-sigstop
// when its SIGCONT is due (the fault's time plus StopFor).

// hasFault reports whether s has a fault of kind.
func hasFault(s *scenarios.Scenario, kind string) bool {
	for _, f := range s.Faults {
		if f.Kind == kind {
			return true
		}
	}
	return false
}

// waitHealed waits until the registry's filled storage was given back
// (a case with registry-storage-full), so the final check meets a healed
// registry, and notes when the last timed registry fault healed. A disk
// that does not heal within budget, or whose heal failed, is the harness's
// error: the case proves nothing.
func (cr *caseRun) waitHealed(ctx context.Context, budget time.Duration) error {
	for _, in := range cr.rc.Injections {
		if strings.HasPrefix(in.Fault, injector.FaultRegistrySigstop) && in.Landed {
			cr.noteHeal(in.ActualNs + int64(cr.sigstopFor()))
		}
	}
	d := cr.st.RegistryDisk
	if d == nil || !hasFault(cr.s, injector.FaultRegistryStorageFull) {
		return nil
	}
	deadline := time.Now().Add(budget)
	for {
		ns, err := d.Healed()
		switch {
		case err != nil:
			return harnessErr(fmt.Errorf("the registry's storage did not heal: %w", err))
		case ns > 0:
			cr.noteHeal(ns)
			return cr.registryHealed(ctx, budget)
		case time.Now().After(deadline):
			return harnessErr(fmt.Errorf("the registry's storage still full %s after the fault", budget))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// sigstopFor is the scaled StopFor of the case's registry-sigstop.
func (cr *caseRun) sigstopFor() time.Duration {
	for _, f := range cr.s.Faults {
		if f.Kind == injector.FaultRegistrySigstop {
			return cr.r.scale(f.StopFor)
		}
	}
	return 0
}

func (cr *caseRun) noteHeal(ns int64) {
	if ns > cr.healNs {
		cr.healNs = ns
	}
}

// withHeal adds the heal to a case's timeline, in time order.
func withHeal(tl []reports.TimelineEvent, healNs int64) []reports.TimelineEvent {
	i := len(tl)
	for i > 0 && tl[i-1].TsNs > healNs {
		i--
	}
	ev := reports.TimelineEvent{TsNs: healNs, Kind: "healed", Note: "the registry fault healed"}
	return append(tl[:i], append([]reports.TimelineEvent{ev}, tl[i:]...)...)
}
