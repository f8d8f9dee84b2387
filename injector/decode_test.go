package injector

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/vmchaos/vmchaos/failpoint"
)

var decodeSamples = []string{
	`{"ts_ns":1234567890,"seq":7,"pid":4242,"proc":"vmctl","point":"snapshot.save.captured","vm":"UYUJHVIINCOFODLV4F7KJVRFJY","op":"op-1"}`,
	`{"ts_ns":1234567890,"pid":4242,"proc":"vmctl","point":"snapshot.save.captured","vm":"UYUJHVIINCOFODLV4F7KJVRFJY","op":"op-1","attrs":{"i":1}}`,
	`{"ts_ns":5,"seq":4,"pid":909,"proc":"vmctl","point":"failpoint.signal","vm":"V","attrs":{"delay_ns":2950000,"hit_seq":3,"late_ns":786,"once":"c8-f0","point":"vm.clone.reserved","signal":"KILL"}}`,
	`{"ts_ns":5,"pid":9,"proc":"nodeagent","point":"agent.child.exec","attrs":{"argv":["vmctl","vm","clone","--name","a\"b"],"child_pid":12}}`,
	`{"ts_ns":5,"pid":9,"proc":"p","point":"x","attrs":{"a":1},"attrs":{"b":2}}`, // merged, as encoding/json does
	`{"ts_ns":5,"pid":9,"proc":"p","point":"x","attrs":{}}`,
	`{"ts_ns":5,"pid":9,"proc":"p","point":"x","attrs":null}`,
	`{"ts_ns":5,"pid":9,"proc":"p","point":"x","vm":null}`,
	`{"ts_ns":5,"pid":9,"proc":"p","point":"caf\u00e9"}`,
	`{"ts_ns":5,"pid":9,"proc":"p","point":"café"}`,
	`{"ts_ns":5,"pid":9,"proc":"p","point":"x\ny"}`,
	`{ "ts_ns": 5, "pid": 9, "proc": "p", "point": "x" }`,
	`{"TS_NS":5,"pid":9,"proc":"p","point":"x"}`,
	`{"ts_ns":5,"pid":9,"proc":"p","point":"x","extra":[1,2]}`,
	`{"ts_ns":5.0,"pid":9,"proc":"p","point":"x"}`,
	`{"ts_ns":1e3,"pid":9,"proc":"p","point":"x"}`,
	`{"ts_ns":05,"pid":9,"proc":"p","point":"x"}`,
	`{"ts_ns":-5,"pid":9,"proc":"p","point":"x"}`,
	`{"ts_ns":5,"pid":99999999999,"proc":"p","point":"x"}`,
	`{"ts_ns":5,"seq":18446744073709551615,"pid":9,"proc":"p","point":"x"}`,
	`{"ts_ns":5,"seq":18446744073709551616,"pid":9,"proc":"p","point":"x"}`,
	`{"ts_ns":0,"pid":9,"proc":"p","point":"x"}`,
	`{"ts_ns":5,"pid":9,"proc":"p"}`,
	`{"ts_ns":5,"pid":9,"proc":"p","point":"x"}trailing`,
	`{"ts_ns":5,"pid":9,"proc":"p","point":"x"} `,
	`{"ts_ns":5,"pid":9,"proc":"p","point":"x",}`,
	`{"ts_ns":5,"pid":9,"proc":"p","point":"x","attrs":{"a":]}}`,
	`{}`, `{`, `[`, `null`, ``, `{"ts_ns":"5"}`,
}

// sameDecode: decodeEvent is ParseEvent — the same event, or both refuse.
func sameDecode(t *testing.T, b []byte, in interner) {
	t.Helper()
	got, gerr := decodeEvent(b, in)
	want, werr := failpoint.ParseEvent(b)
	if (gerr == nil) != (werr == nil) {
		t.Fatalf("%q: decodeEvent err %v, ParseEvent err %v", b, gerr, werr)
	}
	if werr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\ndecodeEvent %+v\nParseEvent  %+v", b, got, want)
	}
}

func TestDecodeEventMatchesParseEvent(t *testing.T) {
	in := interner{}
	for _, s := range decodeSamples {
		sameDecode(t, []byte(s), in)
	}
	// What the emitter itself writes.
	ev := failpoint.Event{TsNs: 77, Seq: 3, Pid: 12, Proc: "fakech", Point: "ch.snapshot.memory-writing", VM: "V", Op: "o",
		Attrs: map[string]any{"bytes": 4096.0, "path": "/tmp/x y/\"q\""}}
	b, err := jsonMarshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	sameDecode(t, b, in)
}

// TestDecodeWithoutAttrsDoesNotAllocate: the reader's decode of a datagram
// without attrs allocates nothing once its strings are interned; with attrs
// only the attrs themselves.
func TestDecodeWithoutAttrsDoesNotAllocate(t *testing.T) {
	in := interner{}
	plain := []byte(decodeSamples[0])
	if n := testing.AllocsPerRun(1000, func() { _, _ = decodeEvent(plain, in) }); n != 0 {
		t.Fatalf("%v allocations per datagram without attrs, want 0", n)
	}
	withAttrs := []byte(decodeSamples[1])
	full := testing.AllocsPerRun(1000, func() { _, _ = failpoint.ParseEvent(withAttrs) })
	if n := testing.AllocsPerRun(1000, func() { _, _ = decodeEvent(withAttrs, in) }); n >= full {
		t.Fatalf("%v allocations per datagram with attrs, ParseEvent %v: want fewer", n, full)
	}
}

func FuzzDecodeEventMatchesParseEvent(f *testing.F) {
	for _, s := range decodeSamples {
		f.Add([]byte(s))
	}
	in := interner{}
	f.Fuzz(func(t *testing.T, b []byte) { sameDecode(t, b, in) })
}

// BenchmarkDecodeDatagram: one datagram as the reader decodes it (see
// BenchmarkTraceIngest for the whole path through the socket).
func BenchmarkDecodeDatagram(b *testing.B) {
	for _, tc := range []struct{ name, msg string }{{"plain", decodeSamples[0]}, {"attrs", decodeSamples[1]}} {
		msg := []byte(tc.msg)
		b.Run("reader/"+tc.name, func(b *testing.B) {
			in := interner{}
			b.ReportAllocs()
			for b.Loop() {
				_, _ = decodeEvent(msg, in)
			}
		})
		b.Run("ParseEvent/"+tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = failpoint.ParseEvent(msg)
			}
		})
	}
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }
