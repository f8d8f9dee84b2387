package checker

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
)

// TestScrapesAreSamplesInTheOrderTheAgentAnswered: a counter the agent
// reported earlier but whose answer came back later must not be appended
// after a later, higher reading (that reads as a counter going backwards:
// seen in power-cut cases, where ScrapeNow overlaps the background scrape
// while the agent restarts). The second answer of this agent is held back
// while a third request could overtake it.
func TestScrapesAreSamplesInTheOrderTheAgentAnswered(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := n.Add(1)
		if v == 2 {
			time.Sleep(300 * time.Millisecond) // read early, answered late
		}
		fmt.Fprintf(w, "# TYPE nodeagent_wake_total counter\nnodeagent_wake_total{result=\"ok\"} %d\n", v)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	s := NewScraper(func() string { return addr }, time.Hour, failpoint.Now)
	defer s.Stop()
	ctx := context.Background()
	for len(s.Samples()) == 0 { // the background scrape's first reading
		time.Sleep(time.Millisecond)
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { s.ScrapeNow(ctx, failpoint.Now) })
	}
	wg.Wait()
	samples := s.Samples()
	if len(samples) != 4 {
		t.Fatalf("%d samples, want 4", len(samples))
	}
	if back := Backwards(samples); len(back) > 0 {
		t.Fatalf("samples out of answer order: %v", back)
	}
}
