package vmctl

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BenchmarkListJSON1000 runs `vmctl vm list -o json` (the real binary, so
// process start is included) over a store of 1,000 records, half of them
// running with a dead VMM (each liveness-checked, shown "stopped (stale)").
func BenchmarkListJSON1000(b *testing.B) {
	s := newStack(b, "1")
	ctx := context.Background()
	if err := s.m.updateVMs(ctx, "", func(ix *vmIndex) error {
		for i := 0; i < 1000; i++ {
			id := newID()
			v := &VM{ID: id, Name: fmt.Sprintf("vm-%04d", i), State: StateStopped, RunDir: s.m.vmRunDir(id),
				Config:    VMConfig{CPU: 2, Memory: 1 << 30, NICs: 1, Image: s.image},
				Network:   []NIC{{ID: "net0", MAC: macFor(id, 0), IP: fmt.Sprintf("127.99.%d.%d", i/250, 1+i%250), Mask: "255.255.0.0", SSHPort: 2222}},
				CreatedAt: now(), UpdatedAt: now()}
			if i%2 == 0 {
				v.State, v.Pid = StateRunning, 4000000+i // beyond pid_max: dead
			}
			ix.VMs[id] = v
			ix.Names[v.Name] = id
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	bin := filepath.Join(s.bin, "vmctl")
	var cpu time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cmd := exec.Command(bin, "vm", "list", "-o", "json")
		cmd.Env = append(cmd.Environ(), s.env...)
		out, err := cmd.Output()
		if err != nil {
			b.Fatal(err)
		}
		if n := strings.Count(string(out), `"state":"stopped (stale)"`); n != 500 {
			b.Fatalf("%d stale records listed, want 500", n)
		}
		cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	// CPU time is the figure that survives a loaded shared machine.
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
}

// BenchmarkCloneEndToEnd times `vmctl vm clone` (the real binary and a real
// fakech: reserve, copy, launch, restore, NICs, resume, commit) at
// VMCHAOS_TIME_SCALE=0.01. Removing each clone is outside the timer.
func BenchmarkCloneEndToEnd(b *testing.B) {
	s := newStack(b, "0.01")
	s.runVM("a")
	s.ok("snapshot", "save", "--name", "base", "a")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := strings.TrimSpace(s.ok("vm", "clone", "--name", fmt.Sprintf("c%d", i), "base"))
		b.StopTimer()
		s.ok("vm", "rm", "--force", id)
		b.StartTimer()
	}
}

// BenchmarkTapCloneEndToEnd is BenchmarkCloneEndToEnd in tap mode: the same
// name each time (a wake), so the clone also takes the name's slot and writes
// its own cloud-init seed.
func BenchmarkTapCloneEndToEnd(b *testing.B) {
	s := newStack(b, "0.01", "VMCTL_NET_MODE=tap", "VMCTL_SEED_PUBKEY="+testSeedKey)
	a := strings.TrimSpace(s.ok("vm", "run", "--name", "a", s.image))
	s.ok("snapshot", "save", "--name", "base", a)
	s.ok("vm", "rm", "--force", a)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := strings.TrimSpace(s.ok("vm", "clone", "--name", "a", "base"))
		b.StopTimer()
		s.ok("vm", "rm", "--force", id)
		b.StartTimer()
	}
}
