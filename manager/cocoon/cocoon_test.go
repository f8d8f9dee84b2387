package cocoon

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/manager"
)

func read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The adapter reads the recorded `vm list --format json` as the records
// say (c1's VMM was killed -9: the stored state stays running).
func TestParseVMsRecordedList(t *testing.T) {
	vms, err := ParseVMs(read(t, "vm-list.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := []manager.VM{
		{ID: "TPZKARDGDVB3CK2RXPQRPU47BL", Name: "src", State: "running", PID: 13742},
		{ID: "IEERRSC75OLOQ2H4HQDRVQMMDM", Name: "c1", State: "running", PID: 13909},
	}
	if !reflect.DeepEqual(vms, want) {
		t.Fatalf("got %+v\nwant %+v", vms, want)
	}
}

// A VM cocoon gave a CNI NIC (bridge + host-local in the case's netns, the
// clone c1 of a snapshot with one NIC) lists the address IPAM gave it and
// the named netns its TAP lives in: the guest answers at Address inside
// Netns (docs/manager.md "Networking").
func TestParseVMsCNIList(t *testing.T) {
	vms, err := ParseVMs(read(t, "vm-list-cni.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := []manager.VM{{ID: "BQ2EI4CM5OKB6VVJO4OFL6FPRD", Name: "c1", State: "running", PID: 2416,
		Address: "127.77.0.3:22", Netns: "/var/run/netns/cocoon-BQ2EI4CM5OKB6VVJO4OFL6FPRD"}}
	if !reflect.DeepEqual(vms, want) {
		t.Fatalf("got %+v\nwant %+v", vms, want)
	}
	var recs []json.RawMessage
	if err := json.Unmarshal(read(t, "vm-list-cni.json"), &recs); err != nil || len(recs) != 1 {
		t.Fatalf("records: %d %v", len(recs), err)
	}
	// one record alone is what `vm inspect` prints
	if v, err := New(manager.Options{}).ParseVM(recs[0]); err != nil || !reflect.DeepEqual(v, want[0]) {
		t.Fatalf("ParseVM: %+v %v, want %+v", v, err, want[0])
	}
}

// cocoon prints a sentence instead of JSON for an empty list, even with
// --format json; that is an empty list, while anything else that is not
// JSON is an error (a check never passes on unreadable data).
func TestParseEmptyListsAndGarbage(t *testing.T) {
	if vms, err := ParseVMs(read(t, "vm-list-empty.txt")); err != nil || len(vms) != 0 {
		t.Fatalf("empty vm list: %v %v", vms, err)
	}
	if ss, err := ParseSnapshots(read(t, "snapshot-list-empty.txt")); err != nil || len(ss) != 0 {
		t.Fatalf("empty snapshot list: %v %v", ss, err)
	}
	for _, b := range []string{"", "Error: boom", `[{"state":"running"}]`} {
		if _, err := ParseVMs([]byte(b)); err == nil {
			t.Errorf("ParseVMs(%q) accepted", b)
		}
	}
	if _, err := ParseSnapshots([]byte(`[{"name":"x"}]`)); err == nil {
		t.Error("a snapshot without an id accepted")
	}
}

func TestParseSnapshotsRecorded(t *testing.T) {
	ss, err := ParseSnapshots(read(t, "snapshot-list.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := []manager.Snapshot{{ID: "EQKYF4LAV7UDO7FNOEFLJOE546", Name: "base", State: manager.SnapReady}}
	if !reflect.DeepEqual(ss, want) {
		t.Fatalf("got %+v, want %+v", ss, want)
	}
}

// The recorded event stream shows a clone (creating → running) and then
// the kill -9 of its VMM as MODIFIED "stopped (stale)".
func TestParseEventRecordedStream(t *testing.T) {
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(string(read(t, "status-event.jsonl"))), "\n") {
		e, err := ParseEvent([]byte(line))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e.Type+" "+e.Name+" "+e.State)
	}
	want := []string{
		"ADDED src running", "ADDED c1 creating", "MODIFIED c1 running",
		"ADDED src running", "ADDED c1 running", "MODIFIED c1 stopped (stale)",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	for _, bad := range []string{"{}", `{"event":"ADDED"}`, "not json"} {
		if _, err := ParseEvent([]byte(bad)); err == nil {
			t.Errorf("ParseEvent(%q) accepted", bad)
		}
	}
}

// The VMM of the recorded store is recognised by its api.sock path; one of
// another store, or another binary, is not.
func TestVMMOfRecordedArgv(t *testing.T) {
	argv := strings.Fields(string(read(t, "vmm-argv.txt")))
	a := New(manager.Options{Dir: "/tmp/cx"})
	if id, ok := a.VMMOf(argv); !ok || id != "TPZKARDGDVB3CK2RXPQRPU47BL" {
		t.Fatalf("VMMOf = %q, %v", id, ok)
	}
	if _, ok := New(manager.Options{Dir: "/tmp/other"}).VMMOf(argv); ok {
		t.Fatal("a VMM of another store matched")
	}
	other := append([]string{"/usr/bin/qemu-system-x86_64"}, argv[1:]...)
	if _, ok := a.VMMOf(other); ok {
		t.Fatal("another binary matched")
	}
	if got := a.APISocket("X"); got != "/tmp/cx/run/cloudhypervisor/X/api.sock" {
		t.Fatalf("APISocket = %s", got)
	}
}

func TestCommandMapsVerbsAndConfig(t *testing.T) {
	a := recorded(t, "head", manager.Options{Bin: "/bin/cocoon", Config: "/etc/c.yaml", Dir: "/tmp/x"})
	for _, tc := range []struct {
		call manager.Call
		want string
	}{
		{manager.Call{Verb: manager.VerbClone, Snapshot: "base", Name: "tgt"}, "/bin/cocoon --config /etc/c.yaml vm clone --name tgt --output json base"},
		{manager.Call{Verb: manager.VerbSnapshotSave, VM: "src", Name: "s"}, "/bin/cocoon --config /etc/c.yaml snapshot save --name s src"},
		{manager.Call{Verb: manager.VerbRm, VM: "src"}, "/bin/cocoon --config /etc/c.yaml vm rm --force src"},
		{manager.Call{Verb: manager.VerbRestore, VM: "src", Snapshot: "base"}, "/bin/cocoon --config /etc/c.yaml vm restore --output json src base"},
		{manager.Call{Verb: manager.VerbGC}, "/bin/cocoon --config /etc/c.yaml gc"},
	} {
		argv, err := a.Command(tc.call)
		if err != nil || strings.Join(argv, " ") != tc.want {
			t.Errorf("%s: %q %v, want %q", tc.call, strings.Join(argv, " "), err, tc.want)
		}
	}
	if _, err := a.Command(manager.Call{Verb: manager.VerbRecoverStale, VM: "x"}); !errors.Is(err, manager.ErrNotSupported) {
		t.Fatalf("recover-stale: %v, want ErrNotSupported (cocoon has no stale-create verb)", err)
	}
	if _, err := a.Check(context.Background()); !errors.Is(err, manager.ErrNotSupported) {
		t.Fatalf("Check: %v, want ErrNotSupported", err)
	}
}

func TestTempDirsFindsCocoonTemporaries(t *testing.T) {
	d := t.TempDir()
	a := New(manager.Options{Dir: d})
	keep := []string{"run/cloudhypervisor/VM1/overlay.qcow2", "run/cloudhypervisor/VM1/snapshot-notes", "root/snapshot/localfile/S1/config.json"}
	leak := []string{"run/cloudhypervisor/VM1/snapshot-123456/", "run/cloudhypervisor/VM2.restore-staging/", "root/cloudimg/temp/import-9.img", "root/cloudhypervisor/db/.tmp-77"}
	for _, p := range append(keep, leak...) {
		full := filepath.Join(d, p)
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := a.TempDirs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var rel []string
	for _, g := range got {
		r, _ := filepath.Rel(d, g)
		rel = append(rel, r)
	}
	want := []string{"root/cloudhypervisor/db/.tmp-77", "root/cloudimg/temp/import-9.img", "run/cloudhypervisor/VM1/snapshot-123456", "run/cloudhypervisor/VM2.restore-staging"}
	if !reflect.DeepEqual(rel, want) {
		t.Fatalf("got %q\nwant %q", rel, want)
	}
}

// Snapshots names each snapshot's data dir, where the checker reads the
// device tree the VMM captured (device-tree-consistent): cocoon keeps it at
// <root>/snapshot/localfile/<ID>.
func TestSnapshotsNameTheirDir(t *testing.T) {
	a := New(manager.Options{Dir: "/store"})
	a.exec = func(context.Context, ...string) ([]byte, error) { return read(t, "snapshot-list.json"), nil }
	ss, err := a.Snapshots(context.Background())
	if err != nil || len(ss) == 0 {
		t.Fatalf("snapshots %+v %v", ss, err)
	}
	for _, s := range ss {
		if want := "/store/root/snapshot/localfile/" + s.ID; s.Dir != want {
			t.Errorf("snapshot %s: dir %q, want %q", s.ID, s.Dir, want)
		}
	}
}

// TestSetupRefusesARunDirTooLongForSockets: under a run dir whose VMM
// sockets cannot be bound, cocoon's VMMs fail to start and cocoon reports a
// timeout; Setup says why instead, and a short dir passes the check.
func TestSetupRefusesARunDirTooLongForSockets(t *testing.T) {
	long := New(manager.Options{Dir: "/tmp/" + strings.Repeat("d", 60) + "/c1/cocoon"})
	err := long.checkSocketPaths()
	if err == nil || !strings.Contains(err.Error(), "shorter TMPDIR") {
		t.Fatalf("a run dir too long for unix sockets: %v", err)
	}
	if err := long.Setup(context.Background()); err == nil || !strings.Contains(err.Error(), "unix socket") {
		t.Fatalf("Setup under it: %v", err)
	}
	if err := New(manager.Options{Dir: "/tmp/vmchaos-0123456789abcdef/c1/cocoon"}).checkSocketPaths(); err != nil {
		t.Fatalf("a short run dir refused: %v", err)
	}
}
