package reports

import (
	"encoding/xml"
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoad feeds arbitrary bytes as results.json to Load (results come from
// other machines: shards, baselines). Whatever loads must survive a round
// trip and render into well-formed JUnit, Markdown and HTML without
// panicking; whatever does not must be an error, never a panic.
func FuzzLoad(f *testing.F) {
	path := filepath.Join(f.TempDir(), ResultsFile)
	sample, err := Marshal(sampleResults())
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		string(sample), `{}`, `{"cases":[]}`, `{"cases":[{"id":"a","verdict":"pass"}]}`,
		`{"cases":[{"id":"a","verdict":"fail","converge_ms":-1,"timeline":[{"ts_ns":-9223372036854775808,"kind":"fault"},{"ts_ns":9223372036854775807,"kind":"converged"}]}]}`,
		`{"cases":[{"id":"<x>","verdict":"inconclusive","offset_ms":1e308,"trigger":"park ]]>","attempts":-3}]}`,
		`{"shards":["1/2"],"missing_shards":["2/2"],"cases":null}`,
		`{"cases":[{"id":"e","verdict":"error","reason":"\u0001\ufffe]]>\ud800","repro":"x ]]> y","invariants":[{"name":"n","ok":false,"evidence":"a]]]]>>\u001b[31m"}]}]}`,
		`{"cases":[{"id":"a","scenario":"s","verdict":"pass","offset_ms":-1e308,"converge_ms":1e308},{"id":"b","scenario":"s","verdict":"fail","offset_ms":0,"converge_ms":-1},{"id":"c","scenario":"s","verdict":"pass","offset_ms":1e308,"converge_ms":0.001,"landed_phase":"x"}]}`,
		`[1,2]`, `null`, "\xff\xfe", `{"cases":[{"id":"a","verdict":"pass"}]} x`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := Load(path)
		if err != nil {
			return
		}
		r.Dir = "" // not part of the document
		out, err := Marshal(r)
		if err != nil {
			t.Fatalf("parsed results do not marshal: %v", err)
		}
		r2, err := Parse(out)
		if err != nil {
			t.Fatalf("re-parse of marshalled results: %v", err)
		}
		// Compare encodings: an empty list and a missing one are the same
		// results (omitempty), though not DeepEqual.
		if out2, err := Marshal(r2); err != nil || string(out2) != string(out) {
			t.Fatalf("round trip changed the results: %v", err)
		}
		j, err := JUnit(r)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := xml.Unmarshal(j, &v); err != nil {
			t.Fatalf("junit.xml not well-formed: %v", err)
		}
		if _, err := Markdown(r); err != nil {
			t.Fatal(err)
		}
		if _, err := HTML(r); err != nil {
			t.Fatal(err)
		}
		_ = Gate(r, r, DefaultGateOptions())
		if _, err := Merge(r, r); err == nil && len(r.Cases) > 0 {
			t.Fatal("merging a run with itself must refuse the overlap")
		}
	})
}
