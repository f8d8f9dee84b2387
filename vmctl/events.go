package vmctl

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/regress"
	"github.com/vmchaos/vmchaos/timescale"
	"golang.org/x/sys/unix"
)

// StatusEvents emits one StatusEvent per change between passes, until ctx
// ends or emit fails. A pass runs every interval and also whenever the VM
// index changes (inotify on its directory, debounced), as the field's manager
// does (cocoon cmd/vm/status.go runLoop, utils/watch.go WatchFile): a commit
// is seen at once, not an interval later, so short intermediate states are
// not missed. A VMM's death changes no file: it is seen on the interval. The
// first pass emits ADDED for every VM.
//
// A change is a change of the fields the field's manager compares (cocoon
// cmd/vm/status.go vmSnapshot: id, name, state, ip, image, cpu, memory);
// pid, updated_at and the rest of the record ride along in the event but do
// not make one.
//
// The previous pass is kept as frozen values (the display state computed at
// capture time). Comparing against live records instead re-evaluates the
// old side against the same dead PID, so a VMM killed with -9 never shows
// as a change (seed 000).
func (m *Manager) StatusEvents(ctx context.Context, interval time.Duration, emit func(StatusEvent) error) error {
	interval = max(interval, minInterval)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wake := m.watchIndex(ctx)
	pointers := regress.On("event-stream-pointer-snapshot")
	prevVals := map[string]VM{}
	prevRecs := map[string]*VM{}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		ix, err := m.loadVMs()
		if err != nil {
			return err
		}
		ids := make([]string, 0, len(ix.VMs))
		for id := range ix.VMs {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			cur := m.view(ix.VMs[id], false)
			var old *VM
			if pointers {
				// The bug: the stored record is re-reconciled now, against
				// the same dead PID, so old and new always agree on state.
				if r, ok := prevRecs[id]; ok {
					old = m.view(r, false)
				}
			} else if o, ok := prevVals[id]; ok {
				old = &o
			}
			switch {
			case old == nil:
				if err := emit(StatusEvent{Event: EventAdded, VM: *cur}); err != nil {
					return err
				}
			case eventKeyOf(old) != eventKeyOf(cur):
				if err := emit(StatusEvent{Event: EventModified, VM: *cur}); err != nil {
					return err
				}
			}
			prevVals[id] = *cur
			prevRecs[id] = ix.VMs[id]
		}
		gone := make([]string, 0)
		for id := range prevVals {
			if _, ok := ix.VMs[id]; !ok {
				gone = append(gone, id)
			}
		}
		sort.Strings(gone)
		for _, id := range gone {
			if err := emit(StatusEvent{Event: EventDeleted, VM: prevVals[id]}); err != nil {
				return err
			}
			delete(prevVals, id)
			delete(prevRecs, id)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-wake:
		}
	}
}

// eventKey is what makes an event: cocoon's vmSnapshot field set.
type eventKey struct {
	id, name, state, ip, image string
	cpu                        int
	memory                     int64
}

func eventKeyOf(v *VM) eventKey {
	ips := make([]string, 0, len(v.Network))
	for _, n := range v.Network {
		ips = append(ips, n.IP)
	}
	return eventKey{id: v.ID, name: v.Name, state: v.State, ip: strings.Join(ips, ","), image: v.Config.Image,
		cpu: v.Config.CPU, memory: v.Config.Memory}
}

// watchDebounce coalesces a burst of index commits into one pass (cocoon:
// 200 ms); scaled, floored at minInterval.
func watchDebounce() time.Duration { return max(timescale.D(200*time.Millisecond), minInterval) }

// watchIndex returns a channel that receives (at most one pending value)
// after the VM index was replaced or written, until ctx ends. It watches the
// index's directory: every commit renames a temp file over the index, which
// a watch on the file itself would lose. Without inotify it returns nil (the
// interval alone drives the passes).
func (m *Manager) watchIndex(ctx context.Context) <-chan struct{} {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		m.logf("status: no inotify (%v); polling only", err)
		return nil
	}
	dir, base := filepath.Dir(m.vmIndexPath()), filepath.Base(m.vmIndexPath())
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE|unix.IN_CREATE); err != nil {
		unix.Close(fd)
		m.logf("status: inotify watch %s: %v; polling only", dir, err)
		return nil
	}
	// Through the runtime poller, so Close ends a blocked Read.
	f := os.NewFile(uintptr(fd), "inotify")
	out := make(chan struct{}, 1)
	changed := make(chan struct{}, 1)
	context.AfterFunc(ctx, func() { f.Close() })
	go func() {
		buf := make([]byte, 64*1024)
		for {
			n, err := f.Read(buf)
			if err != nil {
				if !errors.Is(err, os.ErrClosed) && ctx.Err() == nil {
					m.logf("status: inotify read: %v; polling only", err)
				}
				return
			}
			if indexTouched(buf[:n], base) {
				select {
				case changed <- struct{}{}:
				default:
				}
			}
		}
	}()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
			if timescale.SleepRaw(ctx, watchDebounce()) != nil {
				return
			}
			select {
			case out <- struct{}{}:
			default:
			}
		}
	}()
	return out
}

// indexTouched reports whether a buffer of inotify events names base.
func indexTouched(buf []byte, base string) bool {
	for len(buf) >= unix.SizeofInotifyEvent {
		// struct inotify_event: wd, mask, cookie, len (native u32), name
		end := unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(buf[12:16]))
		if end > len(buf) {
			return false
		}
		name := strings.TrimRight(string(buf[unix.SizeofInotifyEvent:end]), "\x00")
		if name == base {
			return true
		}
		buf = buf[end:]
	}
	return false
}
