// Package hoststat reads how much CPU the host took from this machine, for
// benchmarks that print the conditions they ran under.
package hoststat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Sample is /proc/stat's cpu line at one moment: steal and total jiffies.
type Sample struct{ steal, total uint64 }

// Now reads /proc/stat's cpu line (user nice system idle iowait irq softirq
// steal); zero when it cannot be read.
func Now() Sample {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return Sample{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var s Sample
	for i := 1; i < len(f) && i <= 8; i++ {
		v, _ := strconv.ParseUint(f[i], 10, 64)
		s.total += v
		if i == 8 {
			s.steal = v
		}
	}
	return s
}

// StealSince says how much CPU the host took since s ("host steal time
// 4.2 % of CPU"), or "" when /proc/stat could not tell.
func (s Sample) StealSince() string {
	pct, ok := s.StealPctSince()
	if !ok {
		return ""
	}
	return fmt.Sprintf("host steal time %.1f %% of CPU", pct)
}

// StealPctSince is the share of CPU time, in %, the host took since s;
// false when /proc/stat could not tell.
func (s Sample) StealPctSince() (float64, bool) {
	n := Now()
	if s.total == 0 || n.total <= s.total {
		return 0, false
	}
	return 100 * float64(n.steal-s.steal) / float64(n.total-s.total), true
}
