// Package offset formats and parses fault offsets, the one place both are
// done: the shortest exact decimal in ms ("448.242187ms", "59ms") or, below
// a millisecond, in µs ("59.5µs"), so case ids, repro lines, reports and
// bisect output read as a person types them; Parse takes back every form
// Format prints.
package offset

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Max bounds an offset: a day is longer than any operation a case runs.
const Max = 24 * time.Hour

// Format prints d as the shortest exact decimal in ms, or in µs below 1ms.
// It is exact to the nanosecond, so Parse(Format(d)) == d.
func Format(d time.Duration) string {
	sign := ""
	u := uint64(d)
	if d < 0 {
		sign, u = "-", uint64(-(d+1))+1 // no overflow at math.MinInt64
	}
	unit, div, digits := "ms", uint64(time.Millisecond), 6
	if u != 0 && u < uint64(time.Millisecond) {
		unit, div, digits = "µs", uint64(time.Microsecond), 3
	}
	s := sign + strconv.FormatUint(u/div, 10)
	if frac := u % div; frac != 0 {
		f := strconv.FormatUint(frac, 10)
		f = strings.Repeat("0", digits-len(f)) + f
		s += "." + strings.TrimRight(f, "0")
	}
	return s + unit
}

// Parse reads a non-negative offset up to Max: a Go duration ("448.242ms",
// "59.5µs", "59.5us", "1m30s") or a bare number of milliseconds ("448.242").
// Both are read with integer arithmetic, so every form Format prints comes
// back exactly.
func Parse(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("offset: empty")
	}
	src := s
	if isDecimal(s) {
		s += "ms"
	} else if _, err := strconv.ParseFloat(s, 64); err == nil {
		// 1e3, Inf, NaN: a number, but not one an offset is written as
		return 0, fmt.Errorf("offset %q: want a decimal number of ms like 59 or 448.242", src)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("offset %q: want a duration like 59ms, 448.242ms or 59.5µs, or a number of ms", src)
	}
	if d < 0 || d > Max {
		return 0, fmt.Errorf("offset %q: out of range [0, %s]", src, Format(Max))
	}
	return d, nil
}

// isDecimal reports whether s is digits with at most one '.', at least one
// digit, optionally signed ("59", "448.242", ".5", "-1").
func isDecimal(s string) bool {
	s = strings.TrimPrefix(strings.TrimPrefix(s, "+"), "-")
	digits, dots := 0, 0
	for _, c := range s {
		switch {
		case c >= '0' && c <= '9':
			digits++
		case c == '.':
			dots++
		default:
			return false
		}
	}
	return digits > 0 && dots <= 1
}

// FromMs is the offset a report's float field of milliseconds holds,
// rounded to the nanosecond it was written from.
func FromMs(ms float64) time.Duration {
	if math.IsNaN(ms) || math.IsInf(ms, 0) || math.Abs(ms) > float64(math.MaxInt64/int64(time.Millisecond)) {
		return 0
	}
	return time.Duration(math.Round(ms * float64(time.Millisecond)))
}
