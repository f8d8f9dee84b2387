package runner

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
)

// Every registry fault heals before the final check, and a case whose heal
// the harness times says how long the node took to converge after it
// (reports.Case.ConvergeAfterHealMs): registry-storage-full heals when the
// injector gives the storage back (the disk stamps it), net-partition,
// net-delay and net-loss when the injector takes the rules or qdiscs off the
// node's path (the path stamps it), registry-sigstop
// when its SIGCONT is due (the fault's time plus StopFor), registry-sigkill
// and registry-restart when the registry first answers /v2/ again after the
// fault (watchHeal polls it from the fault on).

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
	if cr.healSeen != nil {
		select {
		case ns := <-cr.healSeen:
			if ns == 0 {
				return harnessErr(errors.New("the registry or the control plane did not answer again after its fault"))
			}
			cr.noteHeal(ns)
		case <-time.After(budget):
			return harnessErr(fmt.Errorf("the registry or the control plane did not answer within %s after its fault", budget))
		}
	}
	if d := cr.st.RegistryDisk; d != nil && hasFault(cr.s, injector.FaultRegistryStorageFull) {
		return cr.waitStamp(ctx, budget, "the registry's storage", d.Healed)
	}
	if p := cr.st.Net; p != nil && hasNetFault(cr.s) {
		return cr.waitStamp(ctx, budget, "the node's path to the registry", p.Healed)
	}
	return nil
}

// waitStamp waits until healed stamps a heal (what: the thing healed), notes
// it and waits for the registry to answer.
func (cr *caseRun) waitStamp(ctx context.Context, budget time.Duration, what string, healed func() (int64, error)) error {
	deadline := time.Now().Add(budget)
	for {
		ns, err := healed()
		switch {
		case err != nil:
			return harnessErr(fmt.Errorf("%s did not heal: %w", what, err))
		case ns > 0:
			cr.noteHeal(ns)
			return cr.registryHealed(ctx, budget)
		case time.Now().After(deadline):
			return harnessErr(fmt.Errorf("%s still faulted %s after the fault", what, budget))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// healWatchTimeout bounds watchHeal: the registry's RestartSec is 5 s
// (scaled), its start a fraction of a second.
const healWatchTimeout = 60 * time.Second

// watchHeal starts polling the registry's /v2/ after a registry-sigkill or
// registry-restart that landed at faultNs: the first 200 after the fault
// is its heal, sent on cr.healSeen (0: none within healWatchTimeout). One
// watch per case: the registry cases have one such fault.
func (cr *caseRun) watchHeal(kind string, faultNs int64) {
	if (kind != injector.FaultRegistrySigkill && kind != injector.FaultRegistryRestart) || cr.healSeen != nil || cr.st.RegistryURL == "" {
		return
	}
	ch := make(chan int64, 1)
	cr.healSeen = ch
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), healWatchTimeout)
		defer cancel()
		c := cr.st.RegistryClient(200 * time.Millisecond)
		for ctx.Err() == nil {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, cr.st.RegistryURL+"/v2/", nil)
			if err != nil {
				break
			}
			if resp, err := c.Do(req); err == nil {
				resp.Body.Close()
				if now := failpoint.Now(); resp.StatusCode == http.StatusOK && now > faultNs {
					ch <- now
					return
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		ch <- 0
	}()
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
