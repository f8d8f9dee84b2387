package runner

import (
	"context"
	"fmt"
)

// ClockGate is how a case asks for the machine to itself for the part of
// it that lands a fault by the clock (issue #37). The scheduler gives one
// to each alone case (suite.Schedule): Enter returns once nothing else of
// the run is in flight and keeps it so until Leave; before Enter and after
// Leave the case may share the machine like any shared case (its stack
// start and agent start before, its recovery, convergence and teardown
// after: those wait on the product, they place nothing by the clock).
// A case without a gate (a shared case, a --parallel 1 run) runs as if
// the gate were always held.
//
// The timed part starts at the first step whose timing the verdict
// depends on: the measured runs of a window calibration (the fault is
// placed at a fraction of what they measure), else the re-arm restart
// (the armed agent carries the in-victim timers); it ends once every
// fault is in and the while-stopped steps (which race RestartSec) ran.
type ClockGate interface {
	Enter(ctx context.Context) error
	Leave()
}

type clockKey struct{}

// WithClockGate is ctx carrying the gate the runner enters before the
// case's first clock-timed step and leaves once its faults are in.
func WithClockGate(ctx context.Context, g ClockGate) context.Context {
	return context.WithValue(ctx, clockKey{}, g)
}

// ClockGateOf is the gate ctx carries, nil for none.
func ClockGateOf(ctx context.Context) ClockGate {
	g, _ := ctx.Value(clockKey{}).(ClockGate)
	return g
}

// clock is one case run's hold on its gate: entered at most once, left at
// most once (both idempotent, so every path out of the timed part may
// leave).
type clock struct {
	g       ClockGate
	entered bool
	left    bool
}

// enter takes the machine for the timed part: from the measured runs of
// a swept or offset case's window calibration, else from the re-arm
// restart, through the act and the injection. A run cancelled while it waits is interrupted, a harness
// error.
func (c *clock) enter(ctx context.Context) error {
	if c == nil || c.g == nil || c.entered {
		return nil
	}
	if err := c.g.Enter(ctx); err != nil {
		return harnessErr(fmt.Errorf("waiting for the machine to itself before the timed part: %w", err))
	}
	c.entered = true
	return nil
}

// leave gives the machine back: the faults are in (and a while-stopped
// step that races RestartSec has run).
func (c *clock) leave() {
	if c == nil || c.g == nil || !c.entered || c.left {
		return
	}
	c.left = true
	c.g.Leave()
}
