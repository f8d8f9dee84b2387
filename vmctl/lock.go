package vmctl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/vmchaos/vmchaos/timescale"
	"golang.org/x/sys/unix"
)

type lockMode int

const (
	shared lockMode = iota
	exclusive
)

// ErrLocked is returned by a try-lock that found the lock held.
var ErrLocked = errors.New("lock held")

// flock is one held flock. The lock belongs to the open file description, so
// it dies with the process: a crash never wedges a VM or a snapshot.
type flock struct{ f *os.File }

// lockFile takes a flock on path (created if missing, never unlinked). With
// block it waits until ctx ends, polling so that the wait honours ctx.
func lockFile(ctx context.Context, path string, mode lockMode, block bool) (*flock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	how := unix.LOCK_SH
	if mode == exclusive {
		how = unix.LOCK_EX
	}
	delay := 500 * time.Microsecond
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return &flock{f: f}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("flock %s: %w", path, err)
		}
		if !block {
			f.Close()
			return nil, ErrLocked
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			f.Close()
			return nil, fmt.Errorf("wait for lock %s: %w", path, ctx.Err())
		case <-t.C:
		}
		if delay < 20*time.Millisecond {
			delay *= 2
		}
	}
}

// Unlock releases the lock (closing the descriptor). Safe on nil.
func (l *flock) Unlock() {
	if l != nil && l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

// LeaseWait bounds how long a lease reader (clone, export) waits for a
// snapshot's exclusive holder (snapshot rm, gc, a build finishing) before it
// gives up with the in-use refusal. The holder is a live process that lets go
// by itself, so the field's manager waits and retries instead of failing at
// once (seed 001 #3: "a self-clearing transient"). Scaled by
// VMCHAOS_TIME_SCALE.
func LeaseWait() time.Duration { return timescale.D(30 * time.Second) }

// readLease takes snapshot sid's lease shared for verb, waiting up to
// LeaseWait for an exclusive holder.
func (m *Manager) readLease(ctx context.Context, verb, sid string) (*flock, error) {
	wctx, cancel := context.WithTimeout(ctx, LeaseWait())
	defer cancel()
	l, err := lockFile(wctx, m.leasePath(sid), shared, true)
	if err == nil {
		return l, nil
	}
	if ctx.Err() == nil && wctx.Err() != nil {
		// the exact string, id last: embedders parse it
		return nil, fmt.Errorf("%s: "+MsgSnapInUse, verb, sid)
	}
	return nil, fmt.Errorf("%s: lease %s: %w", verb, sid, err)
}
