package injector

import "fmt"

// MountNS is the mount namespace sup's units run in, as a path a thread
// can join (setns), or "" when they run in the caller's own: a mount the
// harness makes for the stack after a sandbox started must be attached
// there too (lazyfs.MountIn).
func MountNS(sup Supervisor) string {
	if s, ok := sup.(*dbusSup); ok && s.kind == KindSandbox && s.rec.Init != nil {
		return fmt.Sprintf("/proc/%d/ns/mnt", s.rec.Init.PID)
	}
	return ""
}
