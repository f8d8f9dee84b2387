package reports

import (
	"fmt"
	"path/filepath"
	"testing"
)

// bigRun is the size of a fine `make chaos` sweep: 500 cases with timelines.
func bigRun() *Results {
	s := sampleResults()
	r := *s
	r.Cases = nil
	for i := range 500 {
		c := s.Cases[i%len(s.Cases)]
		c.ID = fmt.Sprintf("%s#%d", c.ID, i)
		c.OffsetMs = float64(i%50) * 20
		r.Cases = append(r.Cases, c)
	}
	return &r
}

func BenchmarkWriteAll500Cases(b *testing.B) {
	r := bigRun()
	dir := b.TempDir()
	for b.Loop() {
		if err := WriteAll(filepath.Join(dir, "run"), r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLoad500Cases(b *testing.B) {
	dir := b.TempDir()
	if err := WriteAll(dir, bigRun()); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := Load(dir); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkHTML500Cases(b *testing.B) {
	r := bigRun()
	for b.Loop() {
		if _, err := HTML(r); err != nil {
			b.Fatal(err)
		}
	}
}
