package runner

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestLapsWriteOneLinePerCase: with VMCHAOS_LAPS set, a case's phases go
// to the file as one "id phase=ms ..." line, in order; unset, nothing is
// timed or written.
func TestLapsWriteOneLinePerCase(t *testing.T) {
	f := filepath.Join(t.TempDir(), "laps.txt")
	t.Setenv("VMCHAOS_LAPS", "")
	if l := newLaps(); l != nil {
		t.Fatal("laps without VMCHAOS_LAPS")
	}
	var none *laps
	none.lap("stack") // a nil laps is a no-op
	none.flush("x")
	t.Setenv("VMCHAOS_LAPS", f)
	for _, id := range []string{"a", "b"} {
		l := newLaps()
		l.lap("stack")
		l.lap("poll")
		l.flush(id)
	}
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^a stack=\d+ poll=\d+\nb stack=\d+ poll=\d+\n$`).Match(b) {
		t.Fatalf("laps file:\n%s", b)
	}
}
