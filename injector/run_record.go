package injector

import (
	"context"
	"fmt"
	"os"
)

// KindUnsupervised is the kind of a run record whose runner starts its
// processes itself, without a supervisor: a manager run, whose verbs and
// the VMMs they launch carry the record's tag.
const KindUnsupervised = "unsupervised"

// RunRecord is the run record of a run without a supervisor. It is the one
// leftover mechanism of every run: when its runner dies (SIGKILLed, the
// machine's OOM killer), the next run's CleanLeftovers (or `vmchaos doctor
// --clean`) kills every process that carries Tag and started after the
// runner, and removes the recorded dirs.
type RunRecord struct{ rec *Record }

// NewRunRecord cleans what dead runs left (as every supervisor does before
// it starts anything) and writes the record of this run, with the dirs it
// made (absolute, named vmchaos-*, owned by this uid).
func NewRunRecord(ctx context.Context, dirs []string) (*RunRecord, error) {
	_, _ = CleanLeftovers(ctx, Registry()) // errors must not block a new run
	for _, d := range dirs {
		if err := checkRunDir(d, os.Geteuid()); err != nil {
			return nil, fmt.Errorf("run record: %w", err)
		}
	}
	rec, err := newRecord(KindUnsupervised, "")
	if err != nil {
		return nil, fmt.Errorf("run record: %w", err)
	}
	rec.Paths = dirs
	if err := rec.save(); err != nil {
		return nil, err
	}
	return &RunRecord{rec: rec}, nil
}

// Tag is the KEY=VALUE every process of the run must carry.
func (r *RunRecord) Tag() string { return r.rec.Tag() }

// Close removes the record: the run ended and cleaned up after itself.
func (r *RunRecord) Close() { r.rec.remove() }
