package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/failpoint"
)

func init() { register(newPointsCmd) }

func newPointsCmd() *cobra.Command {
	var proc string
	c := &cobra.Command{
		Use:   "points",
		Short: "Print the failpoint catalogue: every named phase and what has/has not happened there",
		Example: `  vmchaos points
  vmchaos points --proc vmctl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
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
	return c
}
