package conformance_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// haltPayload writes the smallest payload cloud-hypervisor boots on x86_64:
// an ELF64 with a PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY, the way
// vmm/src/vm.rs Vm::load_kernel → linux-loader's Elf::load finds the entry)
// whose code is `cli; hlt; jmp .-1`. The vCPU halts for good: no ACPI, no
// interrupts, so the "guest" never acks an eject and never powers off. That
// is enough to run the VMM's boot, pause, device-manager and snapshot paths
// with no guest kernel (fakech never reads a payload).
func haltPayload(t *testing.T, dir string) string {
	t.Helper()
	const (
		ehdrSize = 64
		phdrSize = 56
		load     = 0x100000 // layout::HIGH_RAM_START: the loader refuses lower
	)
	code := []byte{0xfa, 0xf4, 0xeb, 0xfd}
	var note bytes.Buffer
	for _, v := range []uint32{4, 4, 18} { // namesz, descsz, type
		_ = binary.Write(&note, binary.LittleEndian, v)
	}
	note.WriteString("Xen\x00")
	_ = binary.Write(&note, binary.LittleEndian, uint32(load))
	noteOff := uint64(ehdrSize + 2*phdrSize)
	codeOff := noteOff + uint64(note.Len())

	var b bytes.Buffer
	b.Write([]byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0})
	b.Write(make([]byte, 8))
	w := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	w(uint16(2))    // ET_EXEC
	w(uint16(0x3e)) // EM_X86_64
	w(uint32(1))
	w(uint64(load))     // e_entry
	w(uint64(ehdrSize)) // e_phoff
	w(uint64(0))        // e_shoff
	w(uint32(0))
	w(uint16(ehdrSize))
	w(uint16(phdrSize))
	w(uint16(2)) // e_phnum
	w(uint16(0))
	w(uint16(0))
	w(uint16(0))
	phdr := func(typ, flags uint32, off, addr, size uint64) {
		w(typ)
		w(flags)
		w(off)
		w(addr)
		w(addr)
		w(size)
		w(size)
		w(uint64(4))
	}
	phdr(4, 4, noteOff, 0, uint64(note.Len()))   // PT_NOTE
	phdr(1, 5, codeOff, load, uint64(len(code))) // PT_LOAD r-x
	b.Write(note.Bytes())
	b.Write(code)
	p := filepath.Join(dir, "halt.elf")
	if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// rawDisk is a zero-filled disk image (not a fake guest image: fakech boots
// a guest with no files for it, as the docs say).
func rawDisk(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// bootHalted creates and boots a VM whose payload halts (haltPayload), with
// one disk. On the real binary a boot the host refuses skips the row with
// CH's own error and the preflight's verdict: that is the host, not a
// difference between fakech and CH.
func bootHalted(t *testing.T, tg *target, dir, sock string) string {
	t.Helper()
	disk := rawDisk(t, dir, "disk0.img")
	cfg := fmt.Sprintf(`{"cpus":{"boot_vcpus":1,"max_vcpus":1},"memory":{"size":268435456},"payload":{"kernel":%q},"console":{"mode":"Off"},"serial":{"mode":"Null"},"disks":[{"path":%q,"id":"disk0"}]}`,
		haltPayload(t, dir), disk)
	wantNoContent(t, "vm.create", call(t, sock, "PUT", "vm.create", cfg))
	r := call(t, sock, "PUT", "vm.boot", "")
	if r.status != 204 {
		if tg.real {
			t.Skipf("needs a guest: vm.boot of a halting PVH payload failed here: %s %s (%s)", r.statusLine, r.body, strings.TrimPrefix(tg.guest, "needs a guest: "))
		}
		t.Fatalf("vm.boot: %s %s", r.statusLine, r.body)
	}
	if st := vmState(t, sock); st != "Running" {
		t.Fatalf("state after vm.boot: %s", st)
	}
	return disk
}

func vmState(t *testing.T, sock string) string {
	t.Helper()
	r := call(t, sock, "GET", "vm.info", "")
	var info struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal(r.body, &info); err != nil {
		t.Fatalf("vm.info: %s %s", r.statusLine, r.body)
	}
	return info.State
}

// treeHas reports whether vm.info's device_tree has a node id.
func treeHas(t *testing.T, sock, id string) bool {
	t.Helper()
	r := call(t, sock, "GET", "vm.info", "")
	var info struct {
		DeviceTree map[string]json.RawMessage `json:"device_tree"`
	}
	if err := json.Unmarshal(r.body, &info); err != nil || r.status != 200 {
		t.Fatalf("vm.info: %s %s", r.statusLine, r.body)
	}
	_, ok := info.DeviceTree[id]
	return ok
}

// neverAcks makes fakech's guest as deaf as the halting payload: no eject
// is ever acked (its eject_ack is 100 hours of running time).
func neverAcks(tg *target) *target {
	if tg.real {
		return tg
	}
	c := *tg
	c.env = append(append([]string(nil), tg.env...), `FAKECH_TIMING={"eject_ack":"100h"}`)
	return &c
}

// wantChain checks an error answer's whole chain (outermost first).
func wantChain(t *testing.T, what string, r resp, status int, chain ...string) {
	t.Helper()
	got := r.msgs()
	if r.status != status || strings.Join(got, "\n") != strings.Join(chain, "\n") {
		t.Errorf("%s: %s %s\nwant %d %q", what, r.statusLine, r.body, status, chain)
		return
	}
	t.Logf("%s: %d %s", what, r.status, r.body)
}

// TestRowBootPauseResumeShutdown: the VM object's states (vmm/src/vm.rs
// VmState::valid_transition, Vm::pause/resume/shutdown; vmm/src/lib.rs
// vm_snapshot needs Paused): pausing twice is an invalid transition, a
// snapshot of a running VM is refused, vm.shutdown goes back to Created.
func TestRowBootPauseResumeShutdown(t *testing.T) {
	row(t, needNothing, func(t *testing.T, tg *target) {
		dir := sockDir(t)
		sock := filepath.Join(dir, "api.sock")
		startAPI(t, tg, sock)
		bootHalted(t, tg, dir, sock)
		wantChain(t, "vm.boot of a booted VM", call(t, sock, "PUT", "vm.boot", ""), 500,
			"Error from API", "The VM could not boot", "VM is already created")
		snap := filepath.Join(dir, "snap")
		if err := os.Mkdir(snap, 0o755); err != nil {
			t.Fatal(err)
		}
		wantChain(t, "vm.snapshot of a running VM", call(t, sock, "PUT", "vm.snapshot", fmt.Sprintf(`{"destination_url":"file://%s"}`, snap)), 500,
			"Error from API", "The VM could not be snapshotted", "Cannot snapshot VM", "Failed to snapshot migratable component", "Trying to snapshot while VM is running")
		wantNoContent(t, "vm.pause", call(t, sock, "PUT", "vm.pause", ""))
		if st := vmState(t, sock); st != "Paused" {
			t.Errorf("state after vm.pause: %s", st)
		}
		wantChain(t, "second vm.pause", call(t, sock, "PUT", "vm.pause", ""), 500,
			"Error from API", "The VM could not be paused", "Cannot pause VM", "Failed to pause migratable component", "Invalid transition: InvalidStateTransition(Paused, Paused)")
		wantNoContent(t, "vm.resume", call(t, sock, "PUT", "vm.resume", ""))
		wantChain(t, "second vm.resume", call(t, sock, "PUT", "vm.resume", ""), 500,
			"Error from API", "The VM could not resume", "Cannot resume VM", "Failed to resume migratable component", "Invalid transition: InvalidStateTransition(Running, Running)")
		wantNoContent(t, "vm.shutdown", call(t, sock, "PUT", "vm.shutdown", ""))
		if st := vmState(t, sock); st != "Created" {
			t.Errorf("state after vm.shutdown: %s", st)
		}
		wantNoContent(t, "vm.delete", call(t, sock, "PUT", "vm.delete", ""))
	})
}

// TestRowEjectPendingWithADeafGuest is the first three rows of the table on
// a guest that never acks: vm.remove-device takes the disk out of the config
// at once, the node stays in the device tree, a second remove fails
// UnknownDeviceId and a new device with that id fails IdentifierNotUnique
// (vmm/src/device_manager.rs DeviceManager::remove_device,
// validate_identifier; vmm/src/vm.rs Vm::remove_device).
func TestRowEjectPendingWithADeafGuest(t *testing.T) {
	row(t, needNothing, func(t *testing.T, tg *target) {
		tg = neverAcks(tg)
		dir := sockDir(t)
		sock := filepath.Join(dir, "api.sock")
		startAPI(t, tg, sock)
		bootHalted(t, tg, dir, sock)
		extra := rawDisk(t, dir, "extra.img")
		r := call(t, sock, "PUT", "vm.add-disk", fmt.Sprintf(`{"path":%q,"id":"d1"}`, extra))
		var pci struct {
			ID  string `json:"id"`
			BDF string `json:"bdf"`
		}
		if err := json.Unmarshal(r.body, &pci); err != nil || r.status != 200 || pci.ID != "d1" || pci.BDF == "" {
			t.Fatalf("vm.add-disk: %s %s (%v)", r.statusLine, r.body, err)
		}
		t.Logf("vm.add-disk: %s", r.body)
		wantNoContent(t, "vm.remove-device", call(t, sock, "PUT", "vm.remove-device", `{"id":"d1"}`))
		if !treeHas(t, sock, "d1") {
			t.Errorf("d1 left the device tree with no guest ack")
		}
		info := call(t, sock, "GET", "vm.info", "")
		if strings.Contains(string(info.body), extra) {
			t.Errorf("the removed disk is still in the config: %s", info.body)
		}
		unknown := "Failed to find device corresponding to the given identifier"
		if tg.major >= 53 {
			unknown += ": d1"
		}
		wantChain(t, "second vm.remove-device", call(t, sock, "PUT", "vm.remove-device", `{"id":"d1"}`), 500,
			"Error from API", "The device could not be removed from the VM", "Error from device manager", unknown)
		wantChain(t, "vm.add-disk with the pending id", call(t, sock, "PUT", "vm.add-disk", fmt.Sprintf(`{"path":%q,"id":"d1"}`, extra)), 500,
			"Error from API", "The disk could not be added to the VM", "Error from device manager", "Invalid identifier as it is not unique: d1")
	})
}

// TestRowDiskLockedAtBoot: a booted VM holds an OFD write lock on its disk,
// so a second VMM booting the same image fails (block/src/fcntl.rs
// try_acquire_lock; vmm/src/vm.rs Vm::boot try_lock_disks).
func TestRowDiskLockedAtBoot(t *testing.T) {
	row(t, needNothing, func(t *testing.T, tg *target) {
		dir := sockDir(t)
		sock := filepath.Join(dir, "api.sock")
		startAPI(t, tg, sock)
		disk := bootHalted(t, tg, dir, sock)
		sock2 := filepath.Join(dir, "api2.sock")
		startAPI(t, tg, sock2)
		cfg := fmt.Sprintf(`{"cpus":{"boot_vcpus":1,"max_vcpus":1},"memory":{"size":268435456},"payload":{"kernel":%q},"console":{"mode":"Off"},"serial":{"mode":"Null"},"disks":[{"path":%q}]}`,
			haltPayload(t, dir), disk)
		wantNoContent(t, "second vm.create", call(t, sock2, "PUT", "vm.create", cfg))
		r := call(t, sock2, "PUT", "vm.boot", "")
		t.Logf("second VMM's vm.boot: %s %s", r.statusLine, r.body)
		m := r.msgs()
		if r.status != 500 || len(m) == 0 || !strings.Contains(string(r.body), "Error locking disk images") || m[len(m)-1] != "The file is already locked" {
			t.Errorf("second VMM's vm.boot on a locked disk: %s %s", r.statusLine, r.body)
		}
	})
}

// TestRowSnapshotAsThePreflightSays: where the preflight says a snapshot
// cannot work (realch.SnapshotBlock: CH ≥ v49 without
// KVM_CAP_NESTED_STATE), vm.snapshot of a paused VM fails on
// KVM_GET_NESTED_STATE (hypervisor/src/kvm/mod.rs, PR #7380); where it says
// nothing, the snapshot is written. fakech always snapshots.
func TestRowSnapshotAsThePreflightSays(t *testing.T) {
	row(t, needNothing, func(t *testing.T, tg *target) {
		dir := sockDir(t)
		sock := filepath.Join(dir, "api.sock")
		startAPI(t, tg, sock)
		bootHalted(t, tg, dir, sock)
		wantNoContent(t, "vm.pause", call(t, sock, "PUT", "vm.pause", ""))
		snap := filepath.Join(dir, "snap")
		if err := os.Mkdir(snap, 0o755); err != nil {
			t.Fatal(err)
		}
		r := call(t, sock, "PUT", "vm.snapshot", fmt.Sprintf(`{"destination_url":"file://%s"}`, snap))
		blocked := tg.real && strings.Contains(tg.snapshot, "snapshot-needs-nested-state")
		t.Logf("vm.snapshot (preflight: %q): %s %s", tg.snapshot, r.statusLine, r.body)
		switch {
		case blocked && (r.status != 500 || !strings.Contains(string(r.body), "NestedState")):
			t.Errorf("the preflight says the snapshot fails on the nested state; CH answered %s %s", r.statusLine, r.body)
		case !blocked && r.status != 204:
			t.Errorf("vm.snapshot: %s %s", r.statusLine, r.body)
		}
		if !blocked {
			for _, f := range []string{"config.json", "state.json", "memory-ranges"} {
				if _, err := os.Stat(filepath.Join(snap, f)); err != nil {
					t.Errorf("snapshot file: %v", err)
				}
			}
		}
		if st := vmState(t, sock); st != "Paused" {
			t.Errorf("state after vm.snapshot: %s", st)
		}
	})
}
