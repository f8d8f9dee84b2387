package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/scenarios"
)

func init() { register(newSweepCmd) }

// sweepCmd holds sweep's flags.
type sweepCmd struct {
	f           runFlags
	id, offsets string
}

func newSweepCmd() *cobra.Command {
	var o sweepCmd
	c := &cobra.Command{
		Use:   "sweep",
		Short: "Run one scenario at every offset of a range (where in the operation does the fault hurt?)",
		Long: `sweep runs one catalogue scenario once per offset (real time, scaled by --time-scale) and writes
the usual reports; report.html's offset × scenario matrix shows the verdict per offset. Offsets after
the operation finished read inconclusive (the fault did not land inside it).`,
		Example: `  vmchaos sweep --scenario sweep-save-sigkill --offsets 0ms..3600ms/120ms --time-scale 0.05
  vmchaos sweep --scenario s002-clone-sigkill-59ms-daemon --offsets 0,20ms,59ms,100ms`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	o.f.add(c)
	c.Flags().StringVar(&o.id, "scenario", "", "scenario id (see `vmchaos run --list`)")
	c.Flags().StringVar(&o.offsets, "offsets", "", "offsets, real time: FROM..TO/STEP or a comma list, or in % of the operation's window (0%..95%/5%) (default: the scenario's fine sweep)")
	_ = c.MarkFlagRequired("scenario")
	return c
}

// run runs the scenario once per offset of the sweep and writes the reports.
func (o *sweepCmd) run(cmd *cobra.Command) error {
	f, id := &o.f, o.id
	cases, err := o.cases()
	if err != nil {
		return err
	}
	ctx, cancel, dir, r, err := f.startRunner("sweep")
	if err != nil {
		return err
	}
	defer cancel()
	fmt.Fprintf(os.Stderr, "vmchaos sweep: %s at %d offset(s) → %s\n", id, len(cases), dir)
	f.meter.Start("sweep", len(cases), 1)
	for _, cs := range cases {
		if ctx.Err() != nil {
			break
		}
		r.RunCase(ctx, cs)
	}
	f.meter.Stop()
	return finish(cmd, r, dir)
}

// cases expands --offsets (or the scenario's own fine sweep) into one case
// per offset.
func (o *sweepCmd) cases() ([]scenarios.Case, error) {
	id := o.id
	s, ok := scenarios.Lookup(id)
	if !ok {
		return nil, fmt.Errorf("unknown scenario %q", id)
	}
	if !s.TakesOffset() {
		return nil, fmt.Errorf("scenario %s: its trigger %q takes no offset", id, s.Faults[0].Trigger)
	}
	spec := o.offsets
	if spec == "" {
		spec = s.FineSweep
	}
	if spec == "" {
		return nil, fmt.Errorf("scenario %s has no sweep of its own: give --offsets", id)
	}
	// a spec in % of the operation's window gives fraction cases,
	// resolved on each case's stack like the catalogue's fine sweeps
	var cases []scenarios.Case
	if scenarios.IsFracSweep(spec) {
		fracs, err := scenarios.ParseFracSweep(spec)
		if err != nil {
			return nil, err
		}
		for _, fr := range fracs {
			cs, err := scenarios.CaseForFrac(id, fr, o.f.backend)
			if err != nil {
				return nil, err
			}
			cases = append(cases, cs)
		}
		return cases, nil
	}
	offs, err := injector.ParseSweep(spec)
	if err != nil {
		return nil, err
	}
	for _, off := range offs {
		cs, err := scenarios.CaseFor(id, off, true, o.f.backend)
		if err != nil {
			return nil, err
		}
		cases = append(cases, cs)
	}
	return cases, nil
}
