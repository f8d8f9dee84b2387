package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/reports"
	"github.com/vmchaos/vmchaos/scenarios"
	"github.com/vmchaos/vmchaos/scenarios/runner"
)

func init() { register(newBisectCmd) }

// bisectCmd holds bisect's flags.
type bisectCmd struct {
	f                        runFlags
	id, from, to, resolution string
}

func newBisectCmd() *cobra.Command {
	var o bisectCmd
	c := &cobra.Command{
		Use:   "bisect",
		Short: "Binary-search the offset window in which a scenario's verdict flips",
		Long: `bisect runs the scenario at --from and --to; if the verdicts differ it halves the interval until
it is narrower than --resolution, then prints the window [lo, hi] where the verdict changes (and
what it changes from and to), with a repro command for each side.`,
		Example: `  vmchaos bisect --scenario sweep-save-sigkill --from 0ms --to 3600ms --resolution 20ms --time-scale 0.05`,
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	o.f.add(c)
	c.Flags().StringVar(&o.id, "scenario", "", "scenario id (see `vmchaos run --list`)")
	c.Flags().StringVar(&o.from, "from", "0ms", "low end of the offset window (real time)")
	c.Flags().StringVar(&o.to, "to", "", "high end of the offset window (real time)")
	c.Flags().StringVar(&o.resolution, "resolution", "10ms", "stop when the window is narrower than this")
	_ = c.MarkFlagRequired("scenario")
	_ = c.MarkFlagRequired("to")
	return c
}

// window parses --from, --to and --resolution.
func (o *bisectCmd) window() (lo, hi, res time.Duration, err error) {
	if lo, err = injector.ParseOffset(o.from); err != nil {
		return 0, 0, 0, fmt.Errorf("--from: %w", err)
	}
	if hi, err = injector.ParseOffset(o.to); err != nil {
		return 0, 0, 0, fmt.Errorf("--to: %w", err)
	}
	res, err = injector.ParseOffset(o.resolution)
	if err != nil || res <= 0 {
		return 0, 0, 0, fmt.Errorf("--resolution %q: want a positive offset", o.resolution)
	}
	if hi <= lo {
		return 0, 0, 0, fmt.Errorf("--to must be after --from")
	}
	return lo, hi, res, nil
}

// run runs the scenario at both ends of the window and, when the verdicts
// differ, halves the window down to the resolution and prints where it flips.
func (o *bisectCmd) run(cmd *cobra.Command) error {
	f, id := &o.f, o.id
	lo, hi, res, err := o.window()
	if err != nil {
		return err
	}
	ctx, cancel, dir, r, err := f.startRunner("bisect")
	if err != nil {
		return err
	}
	defer cancel()
	at := func(off time.Duration) (reports.Case, error) { return runAt(ctx, r, id, off, f.backend) }
	f.meter.Start("bisect", bisectSteps(lo, hi, res), 1)
	defer f.meter.Stop()
	a, err := at(lo)
	if err != nil {
		return err
	}
	b, err := at(hi)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if a.Verdict == b.Verdict {
		f.meter.Stop()
		fmt.Fprintf(out, "bisect %s: %s at both %s and %s: no flip to search\n", id, a.Verdict, injector.FormatOffset(lo), injector.FormatOffset(hi))
		return finish(cmd, r, dir)
	}
	for hi-lo > res && ctx.Err() == nil {
		mid := lo + (hi-lo)/2
		// an injection lands within µs of its offset: a finer
		// midpoint only adds digits to every line it is printed on
		if m := mid.Round(time.Microsecond); m > lo && m < hi {
			mid = m
		}
		m, err := at(mid)
		if err != nil {
			return err
		}
		if m.Verdict == a.Verdict {
			lo, a = mid, m
		} else {
			hi, b = mid, m
		}
	}
	f.meter.Stop()
	fmt.Fprintf(out, "bisect %s: verdict flips from %s to %s between %s and %s (real time; scaled ×%g)\n  %s\n  %s\n",
		id, a.Verdict, b.Verdict, injector.FormatOffset(lo), injector.FormatOffset(hi), f.scale, a.Repro, b.Repro)
	return finish(cmd, r, dir)
}

func runAt(ctx context.Context, r *runner.Runner, id string, o time.Duration, backend string) (reports.Case, error) {
	cs, err := scenarios.CaseFor(id, o, true, backend)
	if err != nil {
		return reports.Case{}, err
	}
	return r.RunCase(ctx, cs), nil
}

// bisectSteps is the number of cases a bisect of [lo, hi] down to res
// runs when the verdict flips: both ends, then one per halving.
func bisectSteps(lo, hi, res time.Duration) int {
	n := 2
	for w := hi - lo; w > res; w -= w / 2 {
		n++
	}
	return n
}
