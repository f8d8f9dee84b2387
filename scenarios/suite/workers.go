package suite

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// MaxAuto caps the workers --parallel auto picks on any machine. Every
// shared case runs a whole stack (agent, its supervisor, fake VMMs, vmctl
// children, the trace reader), and its convergence budgets are real time.
const MaxAuto = 4

// AutoWorkers is what --parallel auto picks: two cases per CPU, because a
// case spends most of its wall time in scaled sleeps and waits on its stack
// (a sequential speed:fast run used about half a core), less one per unit
// of the load average already on the machine (each runnable process outside
// the run takes a CPU's share the cases would have had); at least 1
// (sequential on a busy machine) and at most one per CPU and MaxAuto. The
// per-CPU cap is measured (issue #37, speed:fast on 2 cores under load
// 16-40 from other jobs): with 4 workers each shared case took 3-7 times
// its sequential time and the run was no faster (×0.59, ×0.91); with 2 the
// shared cases kept their sequential time and the run took 77% of the
// sequential wall time.
func AutoWorkers(numCPU int, load1 float64) int {
	if math.IsNaN(load1) || load1 < 0 {
		load1 = 0
	}
	n := 2*numCPU - int(math.Round(load1))
	return min(max(n, 1), max(numCPU, 1), MaxAuto)
}

// ParseParallel resolves a --parallel value: "auto" (AutoWorkers over this
// machine's CPUs and its 1-minute load average) or a positive integer. It
// returns the worker count and how it was chosen, for results.json.
func ParseParallel(v string) (int, string, error) {
	if strings.TrimSpace(v) == "auto" {
		cpus := runtime.NumCPU()
		load, err := loadAvg1()
		if err != nil {
			// no load figure: assume the machine is busy rather than idle
			return 1, fmt.Sprintf("auto=1 (%d CPUs, load unknown: %v)", cpus, err), nil
		}
		n := AutoWorkers(cpus, load)
		return n, fmt.Sprintf("auto=%d (%d CPUs, load %.2f)", n, cpus, load), nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 1 {
		return 0, "", fmt.Errorf("--parallel %q: want auto or a number >= 1", v)
	}
	return n, strconv.Itoa(n), nil
}

// loadAvg1 is the 1-minute load average from /proc/loadavg.
func loadAvg1() (float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, fmt.Errorf("load average: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("load average: empty /proc/loadavg")
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("load average: %w", err)
	}
	return v, nil
}
