package offset

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestFormatPrintsTheShortestExactDecimalInMsOrMicroseconds(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0ms"},
		{59 * time.Millisecond, "59ms"},
		{448242187, "448.242187ms"},
		{448242 * time.Microsecond, "448.242ms"},
		{448200 * time.Microsecond, "448.2ms"},
		{time.Millisecond + 1, "1.000001ms"},
		{90 * time.Second, "90000ms"},
		{59500 * time.Nanosecond, "59.5µs"},
		{time.Microsecond, "1µs"},
		{1, "0.001µs"},
		{123, "0.123µs"},
		{999999, "999.999µs"},
		{-59 * time.Millisecond, "-59ms"},
		{math.MinInt64, "-9223372036854.775808ms"},
	} {
		if got := Format(tc.d); got != tc.want {
			t.Errorf("Format(%d) = %q, want %q", int64(tc.d), got, tc.want)
		}
	}
}

func TestParseAcceptsWhatAPersonTypes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"448.242ms", 448242 * time.Microsecond},
		{"448.242", 448242 * time.Microsecond}, // bare number: ms, read exactly (no float rounding)
		{"0.1", 100 * time.Microsecond},
		{"59", 59 * time.Millisecond},
		{" 59ms ", 59 * time.Millisecond},
		{"59.5µs", 59500},
		{"59.5us", 59500},
		{"448242187ns", 448242187}, // the old form still reads
		{"1m30s", 90 * time.Second},
		{"0", 0},
		{"24h", Max},
	} {
		got, err := Parse(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "-1ms", "-1", "24h0m0.000000001s", "25h", "abc", "1e3", "NaN", "Inf", "1..2", "ms"} {
		if d, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) = %v, want an error", bad, d)
		}
	}
}

func TestFormatRoundTripsThroughParse(t *testing.T) {
	ds := []time.Duration{0, 1, 999, 1000, 1001, 999999, time.Millisecond, 448242187, Max - 1, Max}
	for d := time.Duration(1); d < Max; d = d*7 + 3 {
		ds = append(ds, d)
	}
	for _, d := range ds {
		s := Format(d)
		got, err := Parse(s)
		if err != nil || got != d {
			t.Errorf("Parse(Format(%d)=%q) = %d, %v", int64(d), s, int64(got), err)
		}
		// and the bare-number form of the ms output reads back too
		if ms, ok := strings.CutSuffix(s, "ms"); ok {
			if got, err := Parse(ms); err != nil || got != d {
				t.Errorf("Parse(%q) = %d, %v; want %d", ms, int64(got), err, int64(d))
			}
		}
	}
}

func TestFromMsUndoesTheReportsFloat(t *testing.T) {
	for _, d := range []time.Duration{0, 1, 448242187, 59 * time.Millisecond, Max} {
		ms := float64(d) / float64(time.Millisecond)
		if got := FromMs(ms); got != d {
			t.Errorf("FromMs(%v) = %d, want %d", ms, int64(got), int64(d))
		}
	}
	if got := FromMs(math.NaN()); got != 0 {
		t.Errorf("FromMs(NaN) = %v, want 0", got)
	}
}

// FuzzParse: Parse never panics, accepts only offsets in range, and what
// it accepts formats to a string that parses back to the same offset.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"448.242ms", "448.242", "59.5µs", "59us", "1m30s", "0", "24h", "-1", ".5", "1e3", "1.2.3ms"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := Parse(s)
		if err != nil {
			return
		}
		if d < 0 || d > Max {
			t.Fatalf("Parse(%q) = %v: out of range accepted", s, d)
		}
		back, err := Parse(Format(d))
		if err != nil || back != d {
			t.Fatalf("Parse(%q) = %d; Format = %q reads back as %d, %v", s, int64(d), Format(d), int64(back), err)
		}
	})
}
