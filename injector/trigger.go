package injector

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/offset"
)

// Trigger kinds.
const (
	TriggerAt        = "at"         // OFFSET after the N-th hit of POINT
	TriggerPark      = "park"       // while POINT's N-th hit is parked by the failpoint pause protocol (the armer's spec passes the first N-1)
	TriggerAfterExit = "after-exit" // OFFSET after the N-th exit of an agent child of kind CHILD
)

// Trigger says when a fault fires (docs/architecture.md §7). Its text form is
//
//	at POINT[#N][@vm=X] [+ OFFSET]     e.g. "at vm.clone.reserved#1@vm=x + 59ms"
//	park POINT[@vm=X]                  e.g. "park snapshot.save.paused"
//	after-exit CHILD[#N][@vm=X] [+ OFFSET]   e.g. "after-exit snapshot-save + 28ms"
//
// OFFSET is a Go duration ("59ms", "1.5s", "250us") or a bare number of ms.
type Trigger struct {
	Kind   string        `json:"kind"`
	Point  string        `json:"point,omitempty"`
	N      int           `json:"n"`
	VM     string        `json:"vm,omitempty"`
	Offset time.Duration `json:"offset"`
	Child  string        `json:"child,omitempty"` // after-exit: "snapshot-save" = vmctl argv words joined by "-"
}

// ParseTrigger parses the text form of a Trigger.
func ParseTrigger(s string) (Trigger, error) {
	var t Trigger
	s = strings.TrimSpace(s)
	kind, rest, _ := strings.Cut(s, " ")
	t.Kind = kind
	rest = strings.TrimSpace(rest)
	switch kind {
	case TriggerAt, TriggerPark, TriggerAfterExit:
	default:
		return t, fmt.Errorf("trigger %q: kind must be at, park or after-exit", s)
	}
	spec, off, hasOff := strings.Cut(rest, "+")
	spec = strings.TrimSpace(spec)
	if hasOff {
		if kind == TriggerPark {
			return t, fmt.Errorf("trigger %q: park takes no offset (it fires while the point is parked)", s)
		}
		d, err := ParseOffset(off)
		if err != nil {
			return t, fmt.Errorf("trigger %q: %w", s, err)
		}
		t.Offset = d
	}
	if i := strings.LastIndex(spec, "@vm="); i >= 0 {
		t.VM = spec[i+4:]
		spec = spec[:i]
		if t.VM == "" || strings.ContainsAny(t.VM, " \t#@+") {
			return t, fmt.Errorf("trigger %q: bad @vm=", s)
		}
	}
	t.N = 1
	if name, n, ok := strings.Cut(spec, "#"); ok {
		v, err := strconv.Atoi(n)
		if err != nil || v < 1 || strconv.Itoa(v) != n {
			return t, fmt.Errorf("trigger %q: #N must be a positive integer", s)
		}
		t.N, spec = v, name
	}
	if !validName(spec) {
		return t, fmt.Errorf("trigger %q: want a point or child name ([A-Za-z0-9._-]+)", s)
	}
	if kind == TriggerAfterExit {
		t.Child = spec
	} else {
		t.Point = spec
	}
	return t, nil
}

// MustParseTrigger is ParseTrigger for tables of constants; it panics on error.
func MustParseTrigger(s string) Trigger {
	t, err := ParseTrigger(s)
	if err != nil {
		panic(err)
	}
	return t
}

func validName(s string) bool {
	if s == "" || len(s) > 200 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// String is the canonical text form; ParseTrigger(t.String()) == t.
func (t Trigger) String() string {
	var b strings.Builder
	b.WriteString(t.Kind)
	b.WriteByte(' ')
	if t.Kind == TriggerAfterExit {
		b.WriteString(t.Child)
	} else {
		b.WriteString(t.Point)
	}
	if t.N > 1 {
		fmt.Fprintf(&b, "#%d", t.N)
	}
	if t.VM != "" {
		b.WriteString("@vm=" + t.VM)
	}
	if t.Kind != TriggerPark {
		b.WriteString(" + " + FormatOffset(t.Offset))
	}
	return b.String()
}

// ParseOffset parses a non-negative offset (offset.Parse: "448.242ms",
// "59.5µs", a Go duration, or a bare number of ms).
func ParseOffset(s string) (time.Duration, error) { return offset.Parse(s) }

// FormatOffset prints an offset as the shortest exact decimal in ms, or in
// µs below 1ms (offset.Format: "448.242187ms").
func FormatOffset(d time.Duration) string { return offset.Format(d) }

// maxSweep bounds the number of offsets a sweep may expand to.
const maxSweep = 100000

// ParseSweep expands an offset sweep: "FROM..TO/STEP" (inclusive of both ends
// when STEP divides the range), a comma list "0,59ms,1s", or one offset.
func ParseSweep(s string) ([]time.Duration, error) {
	s = strings.TrimSpace(s)
	if from, rest, ok := strings.Cut(s, ".."); ok {
		to, step, ok := strings.Cut(rest, "/")
		if !ok {
			return nil, fmt.Errorf("sweep %q: want FROM..TO/STEP", s)
		}
		a, err := ParseOffset(from)
		if err != nil {
			return nil, fmt.Errorf("sweep %q: from: %w", s, err)
		}
		b, err := ParseOffset(to)
		if err != nil {
			return nil, fmt.Errorf("sweep %q: to: %w", s, err)
		}
		st, err := ParseOffset(step)
		if err != nil {
			return nil, fmt.Errorf("sweep %q: step: %w", s, err)
		}
		if st <= 0 {
			return nil, fmt.Errorf("sweep %q: step must be > 0", s)
		}
		if b < a {
			return nil, fmt.Errorf("sweep %q: TO < FROM", s)
		}
		if int64((b-a)/st) >= maxSweep {
			return nil, fmt.Errorf("sweep %q: more than %d offsets", s, maxSweep)
		}
		var out []time.Duration
		for d := a; d <= b; d += st {
			out = append(out, d)
		}
		return out, nil
	}
	var out []time.Duration
	for _, p := range strings.Split(s, ",") {
		d, err := ParseOffset(p)
		if err != nil {
			return nil, fmt.Errorf("sweep %q: %w", s, err)
		}
		out = append(out, d)
		if len(out) > maxSweep {
			return nil, fmt.Errorf("sweep %q: more than %d offsets", s, maxSweep)
		}
	}
	return out, nil
}
