// Package procstat reads /proc/PID/stat: the few fields vmchaos uses to
// tell one process from another (a pid and its start time are an identity)
// and to judge its state.
package procstat

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Stat is the part of /proc/PID/stat vmchaos reads.
type Stat struct {
	Comm  string
	State byte // R, S, D, Z, ...
	PPID  int
	SID   int
	Flags uint64 // PF_* (PF_KTHREAD: a kernel thread)
	Start uint64 // start time in clock ticks since boot
}

// Read reads /proc/PID/stat.
func Read(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	return Parse(b)
}

// Parse parses /proc/PID/stat; comm may hold spaces and parentheses, so
// the fields after it are found from the last ')'.
func Parse(b []byte) (Stat, error) {
	var st Stat
	open, close := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || close < open {
		return st, fmt.Errorf("proc stat: malformed")
	}
	st.Comm = string(b[open+1 : close])
	f := strings.Fields(string(b[close+1:]))
	// f[0] is field 3 (state); field N is f[N-3].
	if len(f) < 20 || len(f[0]) != 1 {
		return st, fmt.Errorf("proc stat: short")
	}
	st.State = f[0][0]
	var err error
	if st.PPID, err = strconv.Atoi(f[1]); err != nil {
		return st, fmt.Errorf("proc stat: ppid: %w", err)
	}
	if st.SID, err = strconv.Atoi(f[3]); err != nil {
		return st, fmt.Errorf("proc stat: sid: %w", err)
	}
	if st.Flags, err = strconv.ParseUint(f[6], 10, 64); err != nil {
		return st, fmt.Errorf("proc stat: flags: %w", err)
	}
	if st.Start, err = strconv.ParseUint(f[19], 10, 64); err != nil {
		return st, fmt.Errorf("proc stat: starttime: %w", err)
	}
	return st, nil
}
