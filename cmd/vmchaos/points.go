package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
)

func init() { register(newPointsCmd) }

func newPointsCmd() *cobra.Command {
	var proc string
	var coverage []string
	var kinds bool
	c := &cobra.Command{
		Use:   "points",
		Short: "Print the failpoint catalogue: every named phase and what has/has not happened there",
		Long: `points prints every named phase (failpoint) of the stack: the process that hits it, its
operation, what has and what has not happened when it fires.

Actions at a point (VMCHAOS_FAILPOINTS="POINT=ACTION;POINT=ACTION", docs/architecture.md §3):
  pause               block until <VMCHAOS_FAILPOINT_CTL>/POINT.release appears
  sleep(MS)           sleep MS milliseconds, then go on
  exit(CODE)          exit with CODE
  kill                SIGKILL this process now
  error(MSG)          the call site returns MSG as its error
  signal(SIG,DELAY)   go on, and signal this process DELAY after the hit on its own clock
                      (SIG: KILL STOP CONT TERM INT QUIT ABRT HUP SEGV BUS USR1 USR2, "SIG" prefix
                      optional; DELAY: a Go duration such as 59ms or 2950us, or a bare number of ms);
                      it sends a "failpoint.signal" datagram (attrs point, hit_seq, delay_ns, late_ns,
                      signal) right before the signal. The fault is armed inside the victim, so trace
                      delivery is not part of its timing (injector.InVictim, docs/injector.md).
  signal(SIG,DELAY,once=TOKEN)  the same, one-shot across processes: only the process that
                      creates <VMCHAOS_FAILPOINT_CTL>/once-TOKEN.claimed first (O_EXCL) fires, so a
                      restarted victim with the same environment does not signal itself again;
                      kill(once=TOKEN), exit(CODE,once=TOKEN), error(MSG,once=TOKEN): one-shot the same way
Each optionally prefixed "N*" (the first N hits only) and suffixed "@vm=ID" (that VM only), e.g.
  VMCHAOS_FAILPOINTS='vm.clone.reserved=1*signal(KILL,59ms)@vm=web-1'`,
		Example: `  vmchaos points
  vmchaos points --proc vmctl
  vmchaos points --kinds
  vmchaos points --coverage vmchaos-results/chaos-20261201-120000/results.json
  vmchaos points --coverage chaos/results.json,nightly-only/results.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(coverage) > 0 {
				return printCoverage(cmd.OutOrStdout(), coverage)
			}
			if kinds {
				return printFaultKinds(cmd.OutOrStdout())
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "POINT\tPROC\tOP\tHAPPENED\tNOT YET")
			for _, p := range failpoint.Catalogue {
				if proc != "" && p.Proc != proc {
					continue
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", p.Name, p.Proc, p.Op, p.Happened, p.NotYet)
			}
			return w.Flush()
		},
	}
	c.Flags().StringVar(&proc, "proc", "", "only points of this process (vmctl, nodeagent, fakech)")
	c.Flags().StringSliceVar(&coverage, "coverage", nil, "print the phase-coverage map of a run instead: for every operation × failpoint, which applicable fault kinds landed there (and the case that landed), which never did, and which this host cannot run and why (the results.json of a run or a merge), e.g. out/results.json; several (comma-separated or repeated): the cases of every run credit the first's map (runs of one build: a nightly-only selection and the make chaos run it complements)")
	c.Flags().BoolVar(&kinds, "kinds", false, "print the fault kinds instead (the injector's one list, power-cut included): what each does and when it counts as landed")
	return c
}

// printFaultKinds prints every fault kind of the injector's one list.
func printFaultKinds(out io.Writer) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "KIND\tWHAT IT DOES\tLANDED WHEN")
	for _, k := range injector.FaultKinds {
		fmt.Fprintf(w, "%s\t%s\t%s\n", k.Name(), k.Describe(), k.Landed())
	}
	return w.Flush()
}
