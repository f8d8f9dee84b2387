package suite

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// MaxAuto caps the workers --parallel auto picks. Every shared case runs a
// whole stack (agent, its supervisor, fake VMMs, vmctl children, the trace
// reader): beyond four stacks on this project's 2-core machines their
// convergence budgets, which are real time, start to bite even though a
// parked fault lands exactly.
const MaxAuto = 4

// AutoWorkers is what --parallel auto picks: two cases per CPU, because a
// case spends most of its wall time in scaled sleeps and waits on its stack,
// not on the CPU; less one per unit of the load average already on the
// machine (each runnable process outside the run takes a CPU's share the
// cases would have had); at least 1 (sequential in effect on a busy
// machine), at most MaxAuto.
func AutoWorkers(numCPU int, load1 float64) int {
	if math.IsNaN(load1) || load1 < 0 {
		load1 = 0
	}
	n := 2*numCPU - int(math.Round(load1))
	return min(max(n, 1), MaxAuto)
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
