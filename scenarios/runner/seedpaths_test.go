package runner

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeRecord(t *testing.T, status map[string]any) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "vms"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]any{"name": "a", "generation": 3, "status": status})
	if err := os.WriteFile(filepath.Join(dir, "vms", "a.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func readRecord(t *testing.T, dir string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "vms", "a.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// TestRecordEditsWriteWhatTheySay: each hand edit writes what its step
// names and refuses a record it would make no sense on (a harness error,
// never a silently different case).
func TestRecordEditsWriteWhatTheySay(t *testing.T) {
	bound := func() map[string]any {
		return map[string]any{"lifecycle": "ready", "post_clone": "done", "vm_id": "V1"}
	}
	unbound := func() map[string]any { return map[string]any{"lifecycle": "hibernated"} }

	dir := writeRecord(t, bound())
	if err := editRecord(dir, "a", markPostCloneFailed); err != nil {
		t.Fatal(err)
	}
	doc := readRecord(t, dir)
	st := doc["status"].(map[string]any)
	if doc["op"] != "create" || doc["step"] != "cloned" || doc["failed_generation"] != float64(3) ||
		st["lifecycle"] != "failed" || st["post_clone"] != "failed" || st["failed_reason"] != "post_clone" || st["vm_id"] != "V1" {
		t.Errorf("mark-post-clone-failed wrote %v", doc)
	}
	if err := editRecord(writeRecord(t, unbound()), "a", markPostCloneFailed); err == nil || !strings.Contains(err.Error(), "no VM bound") {
		t.Errorf("mark-post-clone-failed on a record without a VM: %v", err)
	}

	dir = writeRecord(t, map[string]any{"lifecycle": "creating", "post_clone": "running", "vm_id": "V1"})
	if err := editRecord(dir, "a", wipeLifecycle); err != nil {
		t.Fatal(err)
	}
	if st := readRecord(t, dir)["status"].(map[string]any); st["lifecycle"] != nil || st["post_clone"] != "running" {
		t.Errorf("wipe-lifecycle left %v", st)
	}
	if err := editRecord(writeRecord(t, unbound()), "a", wipeLifecycle); err == nil {
		t.Error("wipe-lifecycle without a post_clone marker was accepted")
	}

	dir = writeRecord(t, unbound())
	if err := editRecord(dir, "a", markStaleDone); err != nil {
		t.Fatal(err)
	}
	if st := readRecord(t, dir)["status"].(map[string]any); st["post_clone"] != "done" {
		t.Errorf("mark-post-clone-done left %v", st)
	}
	if err := editRecord(writeRecord(t, bound()), "a", markStaleDone); err == nil {
		t.Error("a stale marker on a bound VM was accepted")
	}
}
