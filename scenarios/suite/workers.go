package suite

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// MaxAuto caps the workers --parallel auto picks on any machine. Every
// shared case runs a whole stack (agent, its supervisor, fake VMMs, vmctl
// children, the trace reader), and its convergence budgets are real time.
const MaxAuto = 5

// placesPerCPU is how many cases at once fit on one CPU: 5 on 2 CPUs.
// A case keeps 0.4–0.5 cores busy on average (issue #37, bench-chaos's
// CPU column: user+sys of the harness and of every process of its stacks
// over a sequential run's wall time, on 2 CPUs; two thirds of it the
// product's processes, the vmctl verbs the agent runs above all). With the
// stacks on disk, more than 3 at a time gained nothing: the cases queued
// on the filesystem's journal (shard 2/8 of make chaos at 3 and 4: 47–51
// and 48 s, system time 28–35 and 36 s). With the stacks on a tmpfs of
// the run's own (stack.StackFSAuto, the default when root) the same shard
// took 44 s at 3, 37–38 s at 4, 36 s at 5 and 35 s at 6 (sequential 78 s),
// and the whole of make chaos 51–52 % of its sequential wall at 4 and 45 %
// at 5 (docs/figures.md): at 4 the timed parts' drains kept it above half.
const placesPerCPU = 2.5

// AutoWorkers is what --parallel auto picks from the CPU count and the
// CPUs already busy outside the run (busy, in cores): placesPerCPU places
// per CPU less one per busy CPU (each busy CPU takes a share the cases
// would have had), at most MaxAuto, at least 1 (sequential on a busy
// machine). On an idle 2-CPU host: 5; with one CPU's worth busy, 4; with
// two, 3.
func AutoWorkers(numCPU int, busy float64) int {
	if math.IsNaN(busy) || busy < 0 {
		busy = 0
	}
	fit := int(math.Floor(placesPerCPU*float64(numCPU) + 1e-9))
	n := fit - int(math.Round(busy))
	return min(max(n, 1), MaxAuto)
}

// busyWindow is how long auto watches the CPUs before it picks: long
// enough to average a few scheduler ticks of the other work on the host.
const busyWindow = time.Second

// ParseParallel resolves a --parallel value: "auto" (AutoWorkers over this
// machine's CPUs and the CPU time spent on it over the last busyWindow,
// else its 1-minute load average) or a positive integer. It returns the
// worker count and how it was chosen, for results.json.
func ParseParallel(v string) (int, string, error) {
	if strings.TrimSpace(v) == "auto" {
		cpus := runtime.NumCPU()
		busy, what, err := machineBusy(busyWindow)
		if err != nil {
			// no figure: assume the machine is busy rather than idle
			return 1, fmt.Sprintf("auto=1 (%d CPUs, load unknown: %v)", cpus, err), nil
		}
		n := AutoWorkers(cpus, busy)
		return n, fmt.Sprintf("auto=%d (%d CPUs, %s %.2f)", n, cpus, what, busy), nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 1 {
		return 0, "", fmt.Errorf("--parallel %q: want auto or a number >= 1", v)
	}
	return n, strconv.Itoa(n), nil
}

// machineBusy is the CPUs in use now: the busy time of /proc/stat over
// window, in cores ("busy"), else the 1-minute load average ("load").
// The sample, not the load average, is what auto uses where it can: the
// load average still counts for a minute a run that just ended (the
// sequential run before bench-chaos's scheduled one), and counts tasks
// waiting on I/O that take no CPU.
func machineBusy(window time.Duration) (float64, string, error) {
	a, aerr := readCPUStat()
	if aerr == nil {
		time.Sleep(window)
		b, berr := readCPUStat()
		if berr == nil {
			if busy, ok := busyCores(a, b, runtime.NumCPU()); ok {
				return busy, "busy", nil
			}
		}
	}
	load, err := loadAvg1()
	return load, "load", err
}

// cpuStat is the first line of /proc/stat: all CPUs' time in ticks.
type cpuStat struct{ total, idle uint64 }

func readCPUStat() (cpuStat, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuStat{}, fmt.Errorf("cpu time: %w", err)
	}
	return parseCPUStat(string(b))
}

// parseCPUStat reads the "cpu" line: user nice system idle iowait irq
// softirq steal (guest time is counted in user already); idle is idle +
// iowait.
func parseCPUStat(s string) (cpuStat, error) {
	line, _, _ := strings.Cut(s, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuStat{}, fmt.Errorf("cpu time: no cpu line in /proc/stat")
	}
	var st cpuStat
	for i, x := range f[1:9] {
		v, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return cpuStat{}, fmt.Errorf("cpu time: field %d: %w", i+1, err)
		}
		st.total += v
		if i == 3 || i == 4 {
			st.idle += v
		}
	}
	return st, nil
}

// busyCores is the cores in use between two samples of cpus CPUs; false
// when no time passed between them.
func busyCores(a, b cpuStat, cpus int) (float64, bool) {
	if b.total <= a.total || b.idle < a.idle {
		return 0, false
	}
	dt, di := float64(b.total-a.total), float64(b.idle-a.idle)
	return float64(cpus) * max(dt-di, 0) / dt, true
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
