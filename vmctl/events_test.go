package vmctl

import (
	"context"
	"testing"
	"time"
)

// TestEventStreamWakesOnStoreChangeAndComparesFieldSet: with an interval of
// an hour, every event after the first pass can only come from the inotify
// wake on the VM index. A record edit that touches no field of cocoon's
// vmSnapshot (id, name, state, ip, image, cpu, memory) makes no event; a
// state change does, and a new VM is ADDED.
func TestEventStreamWakesOnStoreChangeAndComparesFieldSet(t *testing.T) {
	s := newStack(t, "0.05")
	a := s.runVM("a")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan StatusEvent, 64)
	done := make(chan error, 1)
	go func() {
		done <- s.m.StatusEvents(ctx, time.Hour, func(e StatusEvent) error {
			events <- e
			return nil
		})
	}()
	next := func(what string) StatusEvent {
		t.Helper()
		select {
		case e := <-events:
			return e
		case err := <-done:
			t.Fatalf("%s: stream ended: %v", what, err)
		case <-time.After(60 * time.Second):
			t.Fatalf("%s: no event (the stream did not wake on the index change)", what)
		}
		return StatusEvent{}
	}
	if e := next("first pass"); e.Event != EventAdded || e.VM.ID != a.ID {
		t.Fatalf("first pass: %+v", e)
	}
	// Only reason, pid-like bookkeeping and updated_at change: no event.
	if _, err := s.m.setVM(ctx, a.ID, func(r *VM) { r.Reason = "bookkeeping only" }); err != nil {
		t.Fatal(err)
	}
	b := s.runVM("b")
	if e := next("vm run b"); e.Event != EventAdded || e.VM.ID != b.ID {
		t.Fatalf("want ADDED b, got %+v (a bookkeeping edit must not make an event)", e)
	}
	s.ok("vm", "stop", "a")
	for {
		e := next("vm stop a")
		if e.VM.ID == b.ID {
			continue // b's own state settling is not under test
		}
		if e.Event != EventModified || e.VM.ID != a.ID || e.VM.State != StateStopped {
			t.Fatalf("want MODIFIED a stopped as the first event of a, got %+v", e)
		}
		break
	}
	s.ok("vm", "rm", "a")
	for {
		e := next("vm rm a")
		if e.VM.ID == b.ID {
			continue
		}
		if e.Event != EventDeleted || e.VM.ID != a.ID {
			t.Fatalf("want DELETED a, got %+v", e)
		}
		break
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("stream: %v", err)
	}
}
