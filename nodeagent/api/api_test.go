package api

import (
	"encoding/json"
	"slices"
	"sort"
	"testing"
)

// TestWireKeysAreTheContract: clients decode these keys; renaming one is a
// contract change (docs/architecture.md §6), so it must show up here.
func TestWireKeysAreTheContract(t *testing.T) {
	full := VMView{Deleted: true, Op: "create", Step: "cloned",
		Status: Status{Message: "m", PostClone: PostCloneDone, VMID: "v", Address: "a", FailedReason: "f", FailedAttempts: 1}}
	b, err := json.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var status map[string]any
	if err := json.Unmarshal(m["status"], &status); err != nil {
		t.Fatal(err)
	}
	var intent map[string]any
	if err := json.Unmarshal(m["intent"], &intent); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		got  []string
		want []string
	}{
		{"VMView", sortedKeys(m), []string{"deleted", "generation", "intent", "name", "op", "status", "step"}},
		{"Status", sortedKeys(status), []string{"address", "failed_attempts", "failed_reason", "lifecycle", "message", "observed_generation", "post_clone", "updated_at", "vm_id"}},
		{"Intent", sortedKeys(intent), []string{"hibernate", "snapshot"}},
	} {
		if !slices.Equal(tc.got, tc.want) {
			t.Errorf("%s keys = %q, want %q", tc.name, tc.got, tc.want)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
