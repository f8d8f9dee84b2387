package stack

import (
	"os"
	"strconv"
	"strings"
)

// NSLocal is a host pid's pid in its own (innermost) pid namespace; 0 when
// it is gone.
func NSLocal(pid int) int { return nsLocal(pid) }

// ChildrenOf lists the host pids of pid's children (every thread's list).
func ChildrenOf(pid int) []int {
	var out []int
	tasks, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + t.Name() + "/children")
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}
