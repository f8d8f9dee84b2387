// Package timescale is the one place product code gets its durations from.
//
// VMCHAOS_TIME_SCALE (float, default 1) multiplies every simulated duration and
// every timer a scenario depends on, so a fast suite (scale 0.05) explores the
// same races as a real-time run: relative windows keep their shape.
package timescale

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// Env is the environment variable that sets the scale.
const Env = "VMCHAOS_TIME_SCALE"

var (
	once   sync.Once
	factor = 1.0
)

// Parse validates a scale string; an empty string means 1.
func Parse(s string) (float64, error) {
	if s == "" {
		return 1, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f > 0 && f <= 1000) { // written so NaN fails too
		return 0, fmt.Errorf("%s=%q: want a number in (0, 1000]", Env, s)
	}
	return f, nil
}

// Factor returns the process-wide scale read from the environment. A bad value
// is reported once on stderr and treated as 1, so a typo never hangs a run.
func Factor() float64 {
	once.Do(func() {
		f, err := Parse(os.Getenv(Env))
		if err != nil {
			fmt.Fprintln(os.Stderr, "warning:", err, "(using 1)")
			f = 1
		}
		factor = f
	})
	return factor
}

// D scales a duration by Factor.
func D(d time.Duration) time.Duration { return Scale(d, Factor()) }

// Scale multiplies d by f.
func Scale(d time.Duration, f float64) time.Duration {
	return time.Duration(float64(d) * f)
}

// Sleep waits D(d) or until ctx is done, whichever comes first.
func Sleep(ctx context.Context, d time.Duration) error {
	return SleepRaw(ctx, D(d))
}

// SleepRaw waits exactly d (already scaled) or until ctx is done.
func SleepRaw(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
