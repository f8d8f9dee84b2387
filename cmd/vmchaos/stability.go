package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/reports"
)

func init() { register(newStabilityCmd) }

// stabilityFlipped is the exit status when a case flipped.
const stabilityFlipped = 1

func newStabilityCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "stability RUN_DIR...",
		Short: "Count the cases, verdict flips and the worst fault-to-window margin over repeated runs",
		Long: `stability reads the results of runs of the same selection (each usually run with
--repeat N, idle and under --load) and prints how many cases there were, which flipped (their
verdicts differ between any two runs, within a dir or across dirs) and the smallest margin
between a fault and its window's edge. This is what ` + "`make stability`" + ` prints. Exit status: 0 no
case flipped and every case passed, 1 a case flipped, 2 no flip but a case never passed, 3 a
results file could not be read.`,
		Example: `  vmchaos run --label-filter speed:fast --time-scale 0.05 --repeat 5 --report-dir out/idle
  vmchaos run --label-filter speed:fast --time-scale 0.05 --repeat 5 --load cpu=1 --report-dir out/load
  vmchaos stability out/idle out/load`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var rs []*reports.Results
			for _, a := range args {
				r, err := reports.Load(a)
				if err != nil {
					return reports.InfraError{Err: fmt.Errorf("stability: %w", err)}
				}
				rs = append(rs, r)
			}
			f := reports.Stability(rs...)
			f.Write(cmd.OutOrStdout())
			switch {
			case len(f.Flipped) > 0:
				return stabilityError{stabilityFlipped, fmt.Sprintf("%d case(s) flipped", len(f.Flipped))}
			case len(f.NotPass) > 0:
				return stabilityError{reports.GateInconclusive, fmt.Sprintf("no flip, but %d case(s) never passed", len(f.NotPass))}
			}
			return nil
		},
	}
}

// stabilityError carries stability's exit status.
type stabilityError struct {
	code int
	msg  string
}

func (e stabilityError) Error() string { return "stability: " + e.msg }
func (e stabilityError) ExitCode() int { return e.code }
