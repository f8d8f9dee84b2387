package fakech

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// eventMonitor writes CH's --event-monitor stream: one pretty-printed JSON
// object per event, {"timestamp":{"secs","nanos"},"source","event",
// "properties"}, the timestamp counted from VMM start.
type eventMonitor struct {
	mu    sync.Mutex
	f     *os.File
	start time.Time
}

type eventTimestamp struct {
	Secs  int64 `json:"secs"`
	Nanos int64 `json:"nanos"`
}

type monitorEvent struct {
	Timestamp  eventTimestamp    `json:"timestamp"`
	Source     string            `json:"source"`
	Event      string            `json:"event"`
	Properties map[string]string `json:"properties"`
}

// openEventMonitor parses --event-monitor path=<p>|fd=<n> and opens it.
func openEventMonitor(spec string, start time.Time) (*eventMonitor, error) {
	kv, err := parseKV("event-monitor", spec, "path", "fd")
	if err != nil {
		return nil, err
	}
	var f *os.File
	switch {
	case kv["path"] != "" && kv["fd"] == "":
		f, err = os.OpenFile(kv["path"], os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return nil, err
		}
	case kv["fd"] != "" && kv["path"] == "":
		n, err := strconv.Atoi(kv["fd"])
		if err != nil || n < 0 {
			return nil, fmt.Errorf("error parsing --event-monitor: fd=%q", kv["fd"])
		}
		f = os.NewFile(uintptr(n), "event-monitor")
	default:
		return nil, fmt.Errorf("error parsing --event-monitor: want path=<p> or fd=<n>")
	}
	return &eventMonitor{f: f, start: start}, nil
}

func (m *eventMonitor) emit(source, event string, props map[string]string) {
	if m == nil {
		return
	}
	d := time.Since(m.start)
	b, err := json.MarshalIndent(monitorEvent{Timestamp: eventTimestamp{Secs: int64(d / time.Second), Nanos: int64(d % time.Second)},
		Source: source, Event: event, Properties: props}, "", "  ")
	if err != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	_, _ = m.f.Write(append(b, '\n', '\n'))
}

func (m *eventMonitor) close() {
	if m != nil {
		m.f.Close()
	}
}
