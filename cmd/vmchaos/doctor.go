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
	"github.com/vmchaos/vmchaos/internal/ownedtemp"
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
	// Registries are the record dirs read: --registry, the default one and
	// every registry indexed under injector.RegistryIndex().
	Registries []string        `json:"registries"`
	Census     injector.Census `json:"census"`
	// OwnedTempRemoved are the temp dirs --clean removed because the
	// process that owned them (a killed `go test`'s stack binaries) is gone.
	OwnedTempRemoved []string `json:"owned_temp_removed,omitempty"`
	// OrphanCgroupsRemoved are the empty vmchaos-* cgroups --clean removed
	// because no run record names them.
	OrphanCgroupsRemoved []string `json:"orphan_cgroups_removed,omitempty"`
}

// censusLeaks makes `doctor --census` exit 1 when the census is not zero.
type censusLeaks int

func (n censusLeaks) Error() string {
	return fmt.Sprintf("census: %d leaked thing(s) of vmchaos runs", int(n))
}
func (censusLeaks) ExitCode() int { return 1 }

// doctorFlags are doctor's options.
type doctorFlags struct {
	clean, json, censusOnly bool
	registry, output        string
	chBinary                string
	census                  injector.CensusOptions
}

// leftoversFound makes doctor exit 1 when a dead run left processes behind
// and --clean was not given.
type leftoversFound int

func (n leftoversFound) Error() string {
	return fmt.Sprintf("%d leftover run(s) of SIGKILLed runners; rerun with --clean to remove them", int(n))
}
func (leftoversFound) ExitCode() int { return 1 }

func newDoctorCmd() *cobra.Command {
	var f doctorFlags
	c := &cobra.Command{
		Use:   "doctor",
		Short: "Say what this host lacks (root, cgroup2, systemd, KVM, CH), list leftovers of SIGKILLed runs and count leaks",
		Long: `doctor checks what the injector and the backends need on this host and reads the run
records every supervisor writes before it starts anything: a run whose runner is gone but
whose processes, sandbox, cgroups, stack dirs or network namespaces remain is a leftover.
Records are read from --registry, the default registry and every registry indexed under
` + injector.RegistryIndex() + ` (a run with a temp registry, a bench, indexes it first).
With --clean those are killed (SIGKILL through verified pidfds; doctor returns only once each
is dead, or fails naming the survivors) and their cgroups, stack dirs (the run's
$TMPDIR/vmchaos-* with its stores, VM disks and sockets; mounts below it are detached first),
network namespaces and records removed, each named in the output — the same cleanup every
new run does on start. A run whose runner is alive is never touched.
The census then counts what belongs to no live run: tagged processes, mounts (FUSE among
them), cgroups, network namespaces, TAP devices, doctor's own fds and bytes under the temp
dirs (docs/injector.md). --census prints only the census.
Exit status: 0, or 1 when leftovers remain (--census: when the census is not zero).`,
		Example: `  vmchaos doctor
  vmchaos doctor --clean
  vmchaos doctor --census --tmp-dir /tmp/soak-tmp --results-dir /tmp/soak
  vmchaos doctor --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runDoctor(cmd, f) },
	}
	fl := c.Flags()
	fl.BoolVar(&f.clean, "clean", false, "kill the leftovers' processes and remove their cgroups, stack dirs, network namespaces and records")
	fl.BoolVar(&f.json, "json", false, "same as -o json")
	fl.BoolVar(&f.censusOnly, "census", false, "print only the leak census; exit 1 when it is not zero")
	fl.StringVar(&f.registry, "registry", injector.Registry(), "directory of run records (env "+injector.EnvRegistry+")")
	fl.StringSliceVar(&f.census.TempDirs, "tmp-dir", nil, "temp dirs whose vmchaos-* entries the census counts (default $TMPDIR or /tmp)")
	fl.StringSliceVar(&f.census.ResultDirs, "results-dir", nil, "report dirs whose bytes the census reports")
	fl.StringVar(&f.census.RunID, "run", "", "census of this run id only")
	fl.StringVarP(&f.output, "output", "o", "text", "text or json")
	fl.StringVar(&f.chBinary, "ch-binary", "cloud-hypervisor", "cloud-hypervisor binary to look for (name on PATH or a path)")
	return c
}

func runDoctor(cmd *cobra.Command, f doctorFlags) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
	defer cancel()
	f.census.Registry = f.registry
	var rep doctorReport
	if f.censusOnly {
		rep.Census = injector.TakeCensus(f.census)
		return printCensusOnly(cmd, f, rep.Census)
	}
	rep.Checks = append(injector.HostChecks(), kvmCheck(), chCheck(ctx, f.chBinary), fuseCheck())
	rep.Registries = injector.Registries(f.registry)
	var err error
	if f.clean {
		rep.Leftovers, err = injector.CleanAllLeftovers(ctx, f.registry)
		rep.Cleaned = true
		if err == nil {
			rep.OwnedTempRemoved, err = ownedtemp.CleanDead(f.census.TempDirs)
		}
		if err == nil {
			rep.OrphanCgroupsRemoved, err = injector.CleanOrphanCgroups(ctx, f.registry)
		}
	} else {
		rep.Leftovers, err = injector.FindAllLeftovers(f.registry)
	}
	if err != nil {
		return fmt.Errorf("doctor: leftovers: %w", err)
	}
	rep.Census = injector.TakeCensus(f.census)
	if err := printDoctor(cmd, f, rep); err != nil {
		return err
	}
	if !f.clean && len(rep.Leftovers) > 0 {
		return leftoversFound(len(rep.Leftovers))
	}
	return nil
}

func printCensusOnly(cmd *cobra.Command, f doctorFlags, c injector.Census) error {
	out := cmd.OutOrStdout()
	if f.json || f.output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(c); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(out, "census (what no live vmchaos run owns):\n%s", c.Table())
	}
	if n := c.Leaks(); n > 0 {
		return censusLeaks(n)
	}
	return nil
}

func printDoctor(cmd *cobra.Command, f doctorFlags, rep doctorReport) error {
	out := cmd.OutOrStdout()
	if f.json || f.output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
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
	fmt.Fprintf(out, "\nleftovers (records in %s):\n", strings.Join(rep.Registries, " "))
	if len(rep.Leftovers) == 0 && len(rep.OwnedTempRemoved) == 0 && len(rep.OrphanCgroupsRemoved) == 0 {
		fmt.Fprintln(out, "  none")
	}
	for _, l := range rep.Leftovers {
		verb := "found"
		if f.clean {
			verb = "cleaned"
		}
		fmt.Fprintf(out, "  %s: %s\n", verb, l)
	}
	for _, d := range rep.OwnedTempRemoved {
		fmt.Fprintf(out, "  cleaned: %s (its owner process is gone)\n", d)
	}
	for _, cg := range rep.OrphanCgroupsRemoved {
		fmt.Fprintf(out, "  cleaned: cgroup %s (empty, no run names it)\n", cg)
	}
	fmt.Fprintf(out, "\ncensus (what no live vmchaos run owns):\n%s", rep.Census.Table())
	return nil
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
