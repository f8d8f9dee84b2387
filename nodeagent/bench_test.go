package nodeagent_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/nodeagent"
)

// BenchmarkRestartToServing: SIGKILL the agent holding 10 ready VMs, start
// it again, wait until the API answers (startup convergence: vm list,
// adoption, dispatch). Seed 001 recorded 10 pods adopted 28 ms after start.
func BenchmarkRestartToServing(b *testing.B) {
	s := newStack(b)
	s.startAgent(nil)
	s.waitAPI()
	for i := 0; i < 10; i++ {
		s.put(fmt.Sprintf("vm%d", i), nodeagent.Intent{Snapshot: s.base})
	}
	for i := 0; i < 10; i++ {
		s.waitGoal(fmt.Sprintf("vm%d", i), nodeagent.LifecycleReady, budget)
	}
	var total time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.killAgent()
		start := time.Now()
		s.startAgent(nil)
		for {
			if _, _, err := s.api("GET", "/v1/vms", nil); err == nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		total += time.Since(start)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/restart-to-serving")
}

// BenchmarkGetVM: one GET /v1/vms/{name} round trip over the unix socket.
func BenchmarkGetVM(b *testing.B) {
	s := newStack(b)
	s.startAgent(nil)
	s.waitAPI()
	s.put("web", nodeagent.Intent{Snapshot: s.base})
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if code, _, err := s.api("GET", "/v1/vms/web", nil); err != nil || code != 200 {
			b.Fatal(code, err)
		}
	}
}
