package realch

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

func BenchmarkPreflightKVM(b *testing.B) {
	var r PreflightResult
	for b.Loop() {
		r = PreflightKVM("")
	}
	b.Logf("verdict here: %s", r)
}

// Launch → vmm.ping answered → Stop (SIGTERM, reaped, files removed), with
// fakech installed as cloud-hypervisor.
func BenchmarkLaunchToReadyAndStop(b *testing.B) {
	r := newFakeRunner(b)
	env, err := Discover(r.opts)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for b.Loop() {
		v, err := Launch(ctx, env, LaunchSpec{Dir: filepath.Join(dir, "vm")})
		if err != nil {
			b.Fatal(err)
		}
		if err := v.Stop(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
