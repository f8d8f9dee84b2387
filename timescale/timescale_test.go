package timescale

import (
	"context"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]float64{"": 1, "0.05": 0.05, "2": 2} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"0", "-1", "abc", "1e9", "NaN"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

func TestScale(t *testing.T) {
	if got := Scale(5*time.Second, 0.05); got != 250*time.Millisecond {
		t.Fatalf("Scale = %v", got)
	}
}

func TestSleepRawEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := SleepRaw(ctx, time.Hour); err != context.Canceled {
		t.Fatalf("SleepRaw on a cancelled ctx = %v", err)
	}
}
