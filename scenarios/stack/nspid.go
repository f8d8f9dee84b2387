package stack

import "github.com/vmchaos/vmchaos/injector"

// NSLocal is a host pid's pid in its own (innermost) pid namespace; 0 when
// it is gone.
func NSLocal(pid int) int { return nsLocal(pid) }

// ChildrenOf lists the host pids of pid's children (every thread's list).
func ChildrenOf(pid int) []int { return injector.Children(pid) }
