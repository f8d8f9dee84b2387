package stack

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/injector"
)

// TraceAccounting checks, once the stack's processes are gone, what the
// datagrams alone cannot show (docs/architecture.md §3): a process that
// could not dial the trace socket (it sent nothing at all), and a clean exit
// whose last datagrams never arrived (its failpoint.TraceEnd against the
// trace: injector.TailLost). nil when every stream is accounted for; the
// error names each process. ctlDir is the stack's VMCHAOS_FAILPOINT_CTL.
func TraceAccounting(ctx context.Context, tr *injector.Trace, ctlDir string) error {
	ends, fails, err := failpoint.ReadTraceReports(ctlDir)
	var why []string
	if err != nil {
		why = append(why, err.Error())
	}
	for _, f := range fails {
		why = append(why, f.String())
	}
	// what the socket still holds is not lost
	if err := tr.Drain(ctx); err != nil {
		why = append(why, err.Error())
	}
	for _, l := range injector.TailLost(tr.Events(), ends) {
		why = append(why, "tail of the stream lost: "+l.String())
	}
	if len(why) == 0 {
		return nil
	}
	if len(why) > 6 {
		why = append(why[:6], fmt.Sprintf("… %d more", len(why)-6))
	}
	return errors.New("trace not accounted for: " + strings.Join(why, "; "))
}

// traceAccounting is TraceAccounting of this stack, as a teardown error.
func (s *Stack) traceAccounting(ctx context.Context) error {
	if s.Trace == nil {
		return nil
	}
	if err := TraceAccounting(ctx, s.Trace, s.CtlDir); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	return nil
}
