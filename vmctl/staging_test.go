package vmctl

import (
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/vmchaos/vmchaos/failpoint"
)

// TestNextSaveReclaimsADeadBuildsStaging: a save killed mid-capture leaves
// its staging dir (a full copy of the guest's memory) with a free lease and
// no record; the next successful save removes it, so a converged store has no
// leftover staging without anyone running gc.
func TestNextSaveReclaimsADeadBuildsStaging(t *testing.T) {
	s := newStack(t, "0.02")
	s.runVM("a")
	if r := s.runEnv([]string{failpoint.EnvFailpoints + "=snapshot.save.captured=kill"}, "snapshot", "save", "--name", "c", "a"); r.signal != syscall.SIGKILL {
		t.Fatal(r)
	}
	if r := s.run("check"); r.code == 0 || !strings.Contains(r.stdout, "no-leftover-staging") {
		t.Fatalf("check should flag the dead build's staging dir: %s", r)
	}
	s.ok("vm", "net", "a", "--nics", "1") // the captured-kill left the VMM paused
	s.ok("snapshot", "save", "--name", "d", "a")
	ents, err := os.ReadDir(s.m.stagingDir())
	if err != nil || len(ents) != 0 {
		t.Fatalf("staging after the next save: %v, %v", ents, err)
	}
	s.check()
}
