package fakech_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/fakech"
)

// TestSnapshotTimingFollowsModelAndScale: a 4 GiB guest's snapshot lasts at
// least the modelled time (fixed + per GiB × 4) at scale 1, ~100× less at
// scale 0.01, and the ch.snapshot.* trace timestamps are spaced by the
// modelled phases. Lower bounds are exact (the model sleeps at least that
// long); upper bounds are generous safety nets for a loaded machine, and the
// measured overrun is logged (docs/fakech.md quotes it).
func TestSnapshotTimingFollowsModelAndScale(t *testing.T) {
	const gib = 4
	model := fakech.DefaultTiming
	memPhase := time.Duration(model.SnapshotPerGiB) * gib
	fixPhase := time.Duration(model.SnapshotFixed)
	var took [2]time.Duration
	for i, scale := range []float64{1, 0.01} {
		t.Run(fmt.Sprint("scale=", scale), func(t *testing.T) {
			trace := newTrace(t)
			dir := vmDir(t, fmt.Sprintf("VMTIMING%d", i))
			g := newGuest(t, dir)
			sock := filepath.Join(dir, "api.sock")
			env := []string{"PATH=" + os.Getenv("PATH"), fmt.Sprint("VMCHAOS_TIME_SCALE=", scale), "VMCHAOS_TRACE=" + trace.path}
			_, c := startReady(t, sock, env, bootArgs(sock, g.path, "", "--memory", fmt.Sprintf("size=%dG", gib))...)
			ctx := ctxT(t)
			if err := c.Pause(ctx, false); err != nil {
				t.Fatal(err)
			}
			snap := filepath.Join(dir, "snap")
			os.Mkdir(snap, 0o755)
			t0 := time.Now()
			if err := c.Snapshot(ctx, snap); err != nil {
				t.Fatal(err)
			}
			took[i] = time.Since(t0)
			want := scaled(memPhase+fixPhase, scale)
			if took[i] < want {
				t.Fatalf("snapshot took %v, modelled %v", took[i], want)
			}
			begin := trace.waitPoint(t, "ch.snapshot.begin")
			mem := trace.waitPoint(t, "ch.snapshot.memory-written")
			done := trace.waitPoint(t, "ch.snapshot.done")
			d1 := time.Duration(mem.TsNs - begin.TsNs)
			d2 := time.Duration(done.TsNs - mem.TsNs)
			// CH's order: device state captured, config.json and state.json
			// written, then memory-ranges (vm.rs Vm::send); the memory write
			// is the last thing before the request returns.
			w1, w2 := scaled(fixPhase+memPhase, scale), time.Duration(0)
			t.Logf("scale %v: request %v (model %v); begin→memory-written %v (model %v, +%v); memory-written→done %v (model %v, +%v)",
				scale, took[i], want, d1, w1, d1-w1, d2, w2, d2-w2)
			if d1 < w1 || d2 < w2 {
				t.Fatalf("trace phases %v/%v shorter than modelled %v/%v", d1, d2, w1, w2)
			}
			if slack := 500 * time.Millisecond; d1 > w1+slack || d2 > w2+slack {
				t.Fatalf("trace phases %v/%v overran the model %v/%v by more than %v", d1, d2, w1, w2, slack)
			}
			if begin.VM != filepath.Base(dir) || begin.Proc != "fakech" {
				t.Fatalf("event %+v: want vm %s, proc fakech", begin, filepath.Base(dir))
			}
		})
	}
	if took[1]*10 > took[0] {
		t.Fatalf("scale 0.01 snapshot took %v, scale 1 took %v: want ~100× shorter", took[1], took[0])
	}
}

func scaled(d time.Duration, f float64) time.Duration { return time.Duration(float64(d) * f) }
