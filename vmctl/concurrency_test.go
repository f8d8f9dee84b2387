package vmctl

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/vmchaos/vmchaos/failpoint"
)

// TestConcurrentOperations runs the library in-process (so -race sees it)
// against real fakech VMMs: 8 parallel creates and saves on different VMs
// lose no index update; conflicting saves and net changes on one VM
// serialize through its ops lock (their traced phase intervals never overlap).
func TestConcurrentOperations(t *testing.T) {
	s := newStack(t, "0.02")
	t.Setenv("VMCHAOS_TIME_SCALE", "0.02") // for the VMMs this process launches
	tr := newTrace(t)
	if err := failpoint.Configure("vmctl", tr.path, "", ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(failpoint.Reset)
	m := s.m
	ctx := context.Background()

	const n = 8
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, 4*n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			v, err := m.Create(failpoint.WithOp(ctx, fmt.Sprintf("create%d", i)), CreateOptions{Name: fmt.Sprintf("vm%d", i), Image: s.image, NICs: 1, Start: true})
			if err != nil {
				errs <- err
				return
			}
			ids[i] = v.ID
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	vs, err := m.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ips := map[string]bool{}
	for _, v := range vs {
		if v.State != StateRunning {
			t.Fatalf("%s is %s", v.Name, v.State)
		}
		ips[v.Network[0].IP] = true
	}
	if len(vs) != n || len(ips) != n {
		t.Fatalf("after %d parallel creates: %d records, %d distinct addresses", n, len(vs), len(ips))
	}

	// 8 parallel saves on different VMs: 8 snapshot records.
	errs = make(chan error, 4*n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if _, err := m.SnapshotSave(ctx, ids[i], fmt.Sprintf("snap%d", i)); err != nil {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	if ss, _ := m.SnapshotList(ctx); len(ss) != n {
		t.Fatalf("after %d parallel saves: %d snapshots", n, len(ss))
	}

	// Conflicting operations on one VM: 4 saves and 4 net changes.
	target := ids[0]
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			op := fmt.Sprintf("conflict%d", i)
			octx := failpoint.WithOp(ctx, op)
			var err error
			if i%2 == 0 {
				_, err = m.SnapshotSave(octx, target, "c-"+op)
			} else {
				_, err = m.Net(octx, target, 1+i%3)
			}
			if err != nil {
				errs <- fmt.Errorf("%s: %w", op, err)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if ss, _ := m.SnapshotList(ctx); len(ss) != n+n/2 {
		t.Fatalf("after conflicting saves: %d snapshots, want %d", len(ss), n+n/2)
	}
	// Every locked phase of one operation lies outside every other's. A
	// save's phases after its ops lock (lease, pending, finalize) run outside
	// it by design and may overlap the next operation.
	afterOpsLock := map[string]bool{"snapshot.save.unlocked": true, "snapshot.save.leased": true,
		"snapshot.save.pending": true, "snapshot.save.finalized": true}
	type span struct {
		op         string
		start, end int64
	}
	spans := map[string]*span{}
	for _, e := range tr.snapshot() {
		if !strings.HasPrefix(e.Op, "conflict") || e.VM != target || strings.HasPrefix(e.Point, "store.") || afterOpsLock[e.Point] {
			continue
		}
		sp := spans[e.Op]
		if sp == nil {
			sp = &span{op: e.Op, start: e.TsNs}
			spans[e.Op] = sp
		}
		sp.end = e.TsNs
	}
	if len(spans) != n {
		t.Fatalf("traced %d conflicting operations, want %d", len(spans), n)
	}
	list := make([]*span, 0, n)
	for _, sp := range spans {
		list = append(list, sp)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].start < list[j].start })
	for i := 1; i < len(list); i++ {
		if list[i].start < list[i-1].end {
			t.Fatalf("%s started inside %s: operations on one VM overlapped", list[i].op, list[i-1].op)
		}
	}
	if rep := m.Check(ctx); !rep.OK {
		t.Fatalf("store after concurrency: %+v", rep.Violations)
	}
}
