// Command vmchaos is the runner: run, sweep, bisect, repro, report, selftest,
// doctor, points, image. Each subcommand lives in its own file and registers
// itself in init.
package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/spf13/cobra"

	"github.com/vmchaos/vmchaos/reports"
)

var subcommands []func() *cobra.Command

// register adds a subcommand constructor; called from init in each file.
func register(f func() *cobra.Command) { subcommands = append(subcommands, f) }

func main() {
	root := &cobra.Command{
		Use:   "vmchaos",
		Short: "Fault-injection and chaos harness for cloud-hypervisor backed VM managers",
		Long: `vmchaos runs a catalogue of chaos scenarios against a node stack (vmctl, nodeagent and a
fake or real cloud-hypervisor), injects faults at millisecond offsets or exact phases, and
checks that the stack converges by itself with nothing lost. See README.md.`,
		Version:       versionString(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	for _, f := range subcommands {
		root.AddCommand(f())
	}
	stopProfile := startCPUProfile(os.Getenv("VMCHAOS_CPUPROFILE"))
	err := root.Execute()
	stopProfile()
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(exitCode(err))
	}
}

// startCPUProfile writes the harness's own CPU profile to path (go tool
// pprof), for the developer who asks where a run's CPU goes
// (docs/figures.md); "" profiles nothing.
func startCPUProfile(path string) (stop func()) {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "warning: VMCHAOS_CPUPROFILE:", err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

// exitCoder lets a subcommand choose its exit status (report gate: 0..3).
type exitCoder interface{ ExitCode() int }

func exitCode(err error) int {
	if ec, ok := err.(exitCoder); ok {
		return ec.ExitCode()
	}
	return 1
}

// versionString is what --version prints: the build stamp every report also
// records (git describe via -ldflags, else the module's VCS info).
func versionString() string {
	if v := reports.BuildInfo(); v != "" {
		return v
	}
	return "unknown"
}
