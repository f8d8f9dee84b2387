package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/vmctl/api"
)

func addOutputFlag(c *cobra.Command, out *string) {
	c.Flags().StringVarP(out, "output", "o", "", `output format: "json" or empty for a table`)
}

func checkFormat(out string) error {
	if out != "" && out != "json" && out != "table" {
		return fmt.Errorf("unknown output format %q (want json)", out)
	}
	return nil
}

// printRecord prints v as JSON with -o json, else just its id: the output
// of the verbs that create or change one record.
func printRecord(out, id string, v any) error {
	if out == "json" {
		return printJSON(os.Stdout, v)
	}
	_, err := fmt.Println(id)
	return err
}

func printJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

func ips(v *api.VM) string {
	var s []string
	for _, n := range v.Network {
		s = append(s, n.IP)
	}
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ",")
}

func printVMs(w io.Writer, out string, vms []*api.VM) error {
	if out == "json" {
		// Compact: a list of 1,000 VMs is parsed by programs, not read.
		return json.NewEncoder(w).Encode(vms)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATE\tCPU\tMEMORY\tPID\tIP")
	for _, v := range vms {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%dM\t%d\t%s\n", v.ID, v.Name, v.State, v.Config.CPU, v.Config.Memory>>20, v.Pid, ips(v))
	}
	return tw.Flush()
}

func printVM(w io.Writer, out string, v *api.VM) error {
	if out == "json" {
		return printJSON(w, v)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "ID:\t%s\nName:\t%s\nState:\t%s\n", v.ID, v.Name, v.State)
	if v.VMMState != "" {
		fmt.Fprintf(tw, "VMM state:\t%s\n", v.VMMState)
	}
	fmt.Fprintf(tw, "CPU:\t%d\nMemory:\t%dM\nImage:\t%s\nPID:\t%d\nRun dir:\t%s\n", v.Config.CPU, v.Config.Memory>>20, v.Config.Image, v.Pid, v.RunDir)
	for _, n := range v.Network {
		fmt.Fprintf(tw, "NIC %s:\t%s mac %s ssh %s\n", n.ID, n.IP, n.MAC, n.Address())
	}
	if v.Reason != "" {
		fmt.Fprintf(tw, "Reason:\t%s\n", v.Reason)
	}
	return tw.Flush()
}

func printSnaps(w io.Writer, out string, ss []*api.Snapshot) error {
	if out == "json" {
		return printJSON(w, ss)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATE\tVM\tSIZE\tCREATED")
	for _, s := range ss {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", s.ID, s.Name, s.State, s.VMID, s.Size, s.CreatedAt.Format("2006-01-02T15:04:05Z"))
	}
	return tw.Flush()
}
