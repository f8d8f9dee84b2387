package api

import (
	"encoding/json"
	"slices"
	"sort"
	"testing"
)

// keys is the sorted set of JSON keys v marshals to.
func keys(t *testing.T, v any) []string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// TestWireKeysAreTheContract: readers (the agent, the stack, the adapter)
// decode these keys; renaming one is a contract change, so it must show up
// here and in docs/architecture.md §4.2, not slip through a refactor.
func TestWireKeysAreTheContract(t *testing.T) {
	full := VM{Network: []NIC{{}}, Ejecting: []string{"x"}, SnapshotIDs: []string{"s"}, Reason: "r", VMMState: "Running"}
	for _, tc := range []struct {
		name string
		v    any
		want []string
	}{
		{"VM", full, []string{"config", "created_at", "ejecting", "id", "name", "network", "pid", "reason", "run_dir", "snapshot_ids", "state", "updated_at", "vmm_state"}},
		{"VM (omitempty)", VM{}, []string{"config", "created_at", "id", "name", "network", "pid", "run_dir", "state", "updated_at"}},
		{"VMConfig", VMConfig{}, []string{"cpu", "image", "memory", "nics", "storage"}},
		{"NIC", NIC{Mask: "m", SSHPort: 1, Tap: "t", HostIP: "h"}, []string{"host_ip", "id", "ip", "mac", "mask", "ssh_port", "tap"}},
		{"Snapshot", Snapshot{}, []string{"created_at", "dir", "id", "name", "size", "state", "vm_id"}},
		{"StatusEvent", StatusEvent{}, []string{"event", "vm"}},
		{"CheckReport", CheckReport{}, []string{"ok", "violations"}},
		{"Violation", Violation{}, []string{"evidence", "invariant"}},
		{"StaleCreateResult", StaleCreateResult{}, []string{"id", "outcome"}},
		{"Observation", Observation{VMsError: "e", SnapshotsError: "e", Check: &CheckReport{}}, []string{"check", "snapshots", "snapshots_error", "vms", "vms_error"}},
		{"Observation (omitempty)", Observation{}, []string{"snapshots", "vms"}},
	} {
		if got := keys(t, tc.v); !slices.Equal(got, tc.want) {
			t.Errorf("%s keys = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestNICAddressDefaultsToPort22(t *testing.T) {
	for _, tc := range []struct {
		nic  NIC
		want string
	}{
		{NIC{IP: "127.1.0.2"}, "127.1.0.2:22"},
		{NIC{IP: "127.1.0.2", SSHPort: 2222}, "127.1.0.2:2222"},
		{NIC{IP: "fd00::2", SSHPort: 22}, "[fd00::2]:22"},
	} {
		if got := tc.nic.Address(); got != tc.want {
			t.Errorf("%+v.Address() = %q, want %q", tc.nic, got, tc.want)
		}
	}
	if got := (VM{}).GuestAddress(); got != "" {
		t.Errorf("GuestAddress without a NIC = %q, want empty", got)
	}
}
