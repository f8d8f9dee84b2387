package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/lazyfs"
)

func init() { register(newDoctorCmd) }

// kvmPreflight reports why real-CH scenarios cannot run here ("" when KVM is
// usable). realch wires it; unset, doctor says it was not checked.
var kvmPreflight func() string

// doctorReport is `vmchaos doctor -o json`.
type doctorReport struct {
	Checks    []injector.Check    `json:"checks"`
	Leftovers []injector.Leftover `json:"leftovers"`
	Cleaned   bool                `json:"cleaned"`
}

// leftoversFound makes doctor exit 1 when a dead run left processes behind
// and --clean was not given.
type leftoversFound int

func (n leftoversFound) Error() string {
	return fmt.Sprintf("%d leftover run(s) of SIGKILLed runners; rerun with --clean to remove them", int(n))
}
func (leftoversFound) ExitCode() int { return 1 }

func newDoctorCmd() *cobra.Command {
	var clean bool
	var registry, output, chBinary string
	c := &cobra.Command{
		Use:   "doctor",
		Short: "Say what this host lacks (root, cgroup2, systemd, KVM, CH) and list leftovers of SIGKILLed runs",
		Long: `doctor checks what the injector and the backends need on this host and reads the run
records every supervisor writes before it starts anything: a run whose runner is gone but
whose processes, sandbox, cgroups, stack dirs or network namespaces remain is a leftover.
With --clean those are killed (SIGKILL through verified pidfds) and their cgroups, stack dirs
(the run's $TMPDIR/vmchaos-* with its stores, VM disks and sockets; mounts below it are
detached first), network namespaces and records removed, each named in the output — the
same cleanup every new run does on start. A run whose runner is alive is never touched.
Exit status: 0, or 1 when leftovers remain.`,
		Example: `  vmchaos doctor
  vmchaos doctor --clean
  vmchaos doctor -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			rep := doctorReport{Checks: injector.HostChecks()}
			rep.Checks = append(rep.Checks, kvmCheck(), chCheck(ctx, chBinary), fuseCheck())
			var err error
			if clean {
				rep.Leftovers, err = injector.CleanLeftovers(ctx, registry)
				rep.Cleaned = true
			} else {
				rep.Leftovers, err = injector.FindLeftovers(registry)
			}
			if err != nil {
				return fmt.Errorf("doctor: leftovers in %s: %w", registry, err)
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "CHECK\tSTATUS\tDETAIL")
				for _, c := range rep.Checks {
					st := "ok"
					if !c.OK {
						st = "missing"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\n", c.Name, st, c.Detail)
				}
				w.Flush()
				fmt.Fprintf(out, "\nleftovers (records in %s):\n", registry)
				if len(rep.Leftovers) == 0 {
					fmt.Fprintln(out, "  none")
				}
				for _, l := range rep.Leftovers {
					verb := "found"
					if clean {
						verb = "cleaned"
					}
					fmt.Fprintf(out, "  %s: %s\n", verb, l)
				}
			}
			if !clean && len(rep.Leftovers) > 0 {
				return leftoversFound(len(rep.Leftovers))
			}
			return nil
		},
	}
	c.Flags().BoolVar(&clean, "clean", false, "kill the leftovers' processes and remove their cgroups, stack dirs, network namespaces and records")
	c.Flags().StringVar(&registry, "registry", injector.Registry(), "directory of run records (env "+injector.EnvRegistry+")")
	c.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	c.Flags().StringVar(&chBinary, "ch-binary", "cloud-hypervisor", "cloud-hypervisor binary to look for (name on PATH or a path)")
	return c
}

func kvmCheck() injector.Check {
	if kvmPreflight == nil {
		return injector.Check{Name: "kvm", OK: false, Detail: "not checked (no KVM preflight linked in)"}
	}
	if why := kvmPreflight(); why != "" {
		return injector.Check{Name: "kvm", OK: false, Detail: why + " (real-CH scenarios skip)"}
	}
	return injector.Check{Name: "kvm", OK: true, Detail: "/dev/kvm usable"}
}

func chCheck(ctx context.Context, bin string) injector.Check {
	if chPreflight != nil {
		return chPreflight(ctx, bin)
	}
	p, err := exec.LookPath(bin)
	if err != nil {
		return injector.Check{Name: "ch", OK: false, Detail: bin + " not found: only the fake backend (fakech) runs"}
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, p, "--version").Output()
	if err != nil {
		return injector.Check{Name: "ch", OK: false, Detail: fmt.Sprintf("%s --version: %v", p, err)}
	}
	return injector.Check{Name: "ch", OK: true, Detail: p + ": " + strings.TrimSpace(string(out))}
}

// fuseCheck says whether the lazy filesystem (power-cut faults) can mount here.
func fuseCheck() injector.Check {
	if why := lazyfs.Available(); why != "" {
		return injector.Check{Name: "fuse", OK: false, Detail: why + " (power-cut cases are inconclusive)"}
	}
	return injector.Check{Name: "fuse", OK: true, Detail: "/dev/fuse opens and this user may mount: lazyfs (power cut) works"}
}
