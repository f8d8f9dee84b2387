package injector

import (
	"encoding/json"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/failpoint"
)

// Reading a datagram without allocating (issue #20): the reader thread
// receives into one buffer with a raw recvfrom (unix.Recvfrom allocates the
// sender's address) and decodes the emitter's fixed, compact schema by hand
// with interned strings — points, processes, VM ids and ops repeat — so a
// datagram without attrs costs no allocation and one with attrs only its
// map. A GC cycle stops the world, and on a loaded host that stop waits for
// every thread: fewer allocations, rarer stops. Anything outside the schema
// the emitter writes (escapes, whitespace, other keys, non-ASCII, floats)
// goes to failpoint.ParseEvent, so the result is ParseEvent's for every
// input (FuzzDecodeEventMatchesParseEvent).

// recvDatagram reads one datagram without blocking; -1 and the error when
// none is queued (EAGAIN).
func recvDatagram(fd int, buf []byte) (int, error) {
	n, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)),
		unix.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(n), nil
}

// interner hands out one string per distinct byte sequence; bounded, so a
// stream of unique ops cannot grow it without end (past the bound new
// strings are allocated as usual). Reader thread only.
type interner map[string]string

const maxInterned = 1 << 14

func (in interner) get(b []byte) string {
	if s, ok := in[string(b)]; ok { // no allocation: the compiler's map-lookup form
		return s
	}
	s := string(b)
	if len(in) < maxInterned {
		in[s] = s
	}
	return s
}

// decodeEvent is failpoint.ParseEvent for the trace reader.
func decodeEvent(b []byte, in interner) (failpoint.Event, error) {
	if ev, ok := decodeFast(b, in); ok {
		if ev.Point == "" || ev.Proc == "" || ev.Pid <= 0 || ev.TsNs <= 0 {
			return ev, fmt.Errorf("trace datagram: missing point, proc, pid or ts_ns")
		}
		return ev, nil
	}
	return failpoint.ParseEvent(b)
}

// decodeFast decodes `{"key":value,...}` with the Event keys, plain ASCII
// strings and unsigned integers; ok=false on anything else.
func decodeFast(b []byte, in interner) (ev failpoint.Event, ok bool) {
	if len(b) < 2 || b[0] != '{' {
		return ev, false
	}
	i := 1
	if b[i] == '}' {
		return ev, i+1 == len(b)
	}
	for {
		key, j, ok := plainString(b, i)
		if !ok || j >= len(b) || b[j] != ':' {
			return ev, false
		}
		if i, ok = decodeField(b, j+1, key, in, &ev); !ok || i >= len(b) {
			return ev, false
		}
		switch b[i] {
		case ',':
			i++
		case '}':
			return ev, i+1 == len(b)
		default:
			return ev, false
		}
	}
}

// decodeField decodes the value of key, which starts at b[i], into ev and
// returns the index right after it; false for a key or value decodeFast
// leaves to ParseEvent.
func decodeField(b []byte, i int, key []byte, in interner, ev *failpoint.Event) (int, bool) {
	switch string(key) {
	case "ts_ns", "seq", "pid":
		n, j, ok := unsignedInt(b, i)
		if !ok {
			return j, false
		}
		switch string(key) {
		case "ts_ns":
			ev.TsNs = int64(n)
		case "seq":
			ev.Seq = n
		default:
			if n > 1<<31-1 { // an int on every platform ParseEvent runs on
				return j, false
			}
			ev.Pid = int(n)
		}
		return j, true
	case "proc", "point", "vm", "op":
		s, j, ok := plainString(b, i)
		if !ok {
			return j, false
		}
		v := in.get(s)
		switch string(key) {
		case "proc":
			ev.Proc = v
		case "point":
			ev.Point = v
		case "vm":
			ev.VM = v
		default:
			ev.Op = v
		}
		return j, true
	case "attrs":
		j, ok := skipObject(b, i)
		if !ok {
			return j, false
		}
		// Into the map so far: a repeated "attrs" merges, as in
		// ParseEvent. (A local, so the event itself stays on the stack.)
		m := ev.Attrs
		if !flatAttrs(b[i:j], in, &m) {
			if err := json.Unmarshal(b[i:j], &m); err != nil {
				return j, false
			}
		}
		ev.Attrs = m
		return j, true
	}
	return i, false
}

// flatAttrs decodes an attrs object whose values are all plain strings or
// integers (what most hits carry: pids, sizes, sequence numbers) into *m,
// as encoding/json would: numbers become float64. false, with *m
// untouched, for anything else (json.Unmarshal's then).
func flatAttrs(b []byte, in interner, m *map[string]any) bool {
	// A first pass checks the shape, so a refusal half-way leaves *m as
	// it was.
	if len(b) == 2 { // {}
		if *m == nil {
			*m = map[string]any{}
		}
		return true
	}
	for pass := 0; pass < 2; pass++ {
		i := 1
		if pass == 1 && *m == nil {
			*m = make(map[string]any, 4)
		}
		for {
			k, j, ok := plainString(b, i)
			if !ok || j >= len(b) || b[j] != ':' {
				return false
			}
			i = j + 1
			var v any
			if i < len(b) && b[i] == '"' {
				s, j, ok := plainString(b, i)
				if !ok {
					return false
				}
				if pass == 1 {
					v = in.get(s)
				}
				i = j
			} else {
				neg := i < len(b) && b[i] == '-'
				if neg {
					i++
				}
				n, j, ok := unsignedInt(b, i)
				if !ok || j-i > 15 { // exact in a float64, as ParseFloat gives it
					return false
				}
				if pass == 1 {
					f := float64(n)
					if neg {
						f = -f
					}
					v = f
				}
				i = j
			}
			if pass == 1 {
				(*m)[in.get(k)] = v
			}
			if i >= len(b) {
				return false
			}
			if b[i] == '}' {
				if i+1 != len(b) {
					return false
				}
				break
			}
			if b[i] != ',' {
				return false
			}
			i++
		}
	}
	return true
}

// plainString reads a JSON string at b[i] without escapes, control or
// non-ASCII bytes (those would need decoding); it returns the bytes between
// the quotes and the index after the closing one.
func plainString(b []byte, i int) ([]byte, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20 || c >= 0x80:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// unsignedInt reads 1–18 decimal digits (no sign, no leading zero but "0",
// no fraction or exponent: those are ParseEvent's to judge).
func unsignedInt(b []byte, i int) (uint64, int, bool) {
	var n uint64
	j := i
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		n = n*10 + uint64(b[j]-'0')
		j++
	}
	if j == i || j-i > 18 || (b[i] == '0' && j-i > 1) {
		return 0, 0, false
	}
	if j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E') {
		return 0, 0, false
	}
	return n, j, true
}

// skipObject returns the index after the JSON object starting at b[i]
// (strings and nesting tracked; validity is json.Unmarshal's to judge).
func skipObject(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '{' {
		return 0, false
	}
	depth, inStr := 0, false
	for j := i; j < len(b); j++ {
		c := b[j]
		if inStr {
			switch c {
			case '\\':
				j++
			case '"':
				inStr = false
			}
			continue
		}
		switch c {
		case '"':
			inStr = true
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return j + 1, true
			}
		}
	}
	return 0, false
}
