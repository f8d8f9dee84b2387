package cidata

import (
	"path/filepath"
	"testing"
)

// The seed volume built in memory, without the durable write.
func BenchmarkBuildFATSeed(b *testing.B) {
	files, err := testCloudInit().Files()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := BuildFAT(CIDataLabel, files); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBuildCIData(b *testing.B) {
	p := filepath.Join(b.TempDir(), "img")
	c := testCloudInit()
	for b.Loop() {
		if err := BuildCIData(p, c); err != nil {
			b.Fatal(err)
		}
	}
}
