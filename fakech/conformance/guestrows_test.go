package conformance_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// The rows below need a booted guest (or a snapshot of one). On fakech they
// are pinned by the fakech tests the docs table names (go test ./fakech);
// on the real binary they skip with the preflight's reason. Each is a test of
// its own so that `go test -v` lists every row with its outcome.

func guestRow(t *testing.T, n need) {
	t.Helper()
	row(t, n, nil)
}

// fakech: TestEjectStaysInTreeUntilGuestAcks.
func TestRowEjectStaysInTreeUntilGuestAcks(t *testing.T) { guestRow(t, needGuest) }

// fakech: TestEjectStaysInTreeUntilGuestAcks, TestSnapshotDuringPendingEjectKeepsNode.
func TestRowIdentifierCheckedAgainstTree(t *testing.T) { guestRow(t, needGuest) }

// fakech: TestEjectStaysInTreeUntilGuestAcks, TestCreateBootShutdownDeleteLifecycle.
func TestRowRemoveUnknownIDOnBootedVM(t *testing.T) { guestRow(t, needGuest) }

// fakech: TestNoEjectCompletesWhilePaused.
func TestRowNoEjectCompletesWhilePaused(t *testing.T) { guestRow(t, needGuest) }

// fakech: TestSnapshotDuringPendingEjectKeepsNode.
func TestRowSnapshotDuringPendingEjectKeepsNode(t *testing.T) { guestRow(t, needSnapshot) }

// fakech: TestSnapshotDuringPendingEjectKeepsNode; vmctl TestCloneAvoidsIdsTheRestoredTreeHolds.
func TestRowCloneTreeHoldsSourceNICs(t *testing.T) { guestRow(t, needSnapshot) }

// fakech: TestRestoreOptionsByVersion (the JSON `resume` of vm.restore).
func TestRowRestoreJSONResume(t *testing.T) { guestRow(t, needSnapshot) }

// fakech: TestKill9MidSnapshotLeavesCHsDebris, TestSnapshotLayoutAndExistingFilesRefused.
func TestRowSnapshotFileOrder(t *testing.T) { guestRow(t, needSnapshot) }

// fakech: TestKill9MidSnapshotLeavesCHsDebris.
func TestRowMemoryRangesPresized(t *testing.T) { guestRow(t, needSnapshot) }

// fakech: TestPingAnswersBeforeTheCLIVMExists. The window is the time the
// command-line VM takes to be created and booted; observing it on the real
// binary needs a payload that boots.
func TestRowPingBeforeTheCLIVMExists(t *testing.T) { guestRow(t, needGuest) }

// fakech: TestDiskAdvisoryLockAndInPlaceWrites (the lock is taken at boot).
func TestRowDiskAdvisoryLock(t *testing.T) { guestRow(t, needGuest) }

// fakech: TestDiskAdvisoryLockAndInPlaceWrites.
func TestRowGuestWritesInPlace(t *testing.T) { guestRow(t, needGuest) }

// fakech: TestQcow2OverlayGuestBootsAndWritesTheTop, TestFakeImageAsQcow2Boots.
func TestRowQcow2BackingChain(t *testing.T) { guestRow(t, needGuest) }

// fakech: TestTapOnlyNICTakesItsAddressFromTheSeed, …FromTheMAC, …AnswersInsideTheVMMsNetns.
func TestRowTapNICAddressFromTheGuest(t *testing.T) { guestRow(t, needGuest) }

// TestRowNetWithoutIP is the config half of the tap-NIC row: a NIC with
// `tap=` and `mac=` and no `ip=` is a valid config (vmm/src/config.rs
// NetConfig::parse, `ip` optional; vm.create does not open the TAP).
func TestRowNetWithoutIP(t *testing.T) {
	row(t, needNothing, func(t *testing.T, tg *target) {
		dir := sockDir(t)
		sock := filepath.Join(dir, "api.sock")
		startAPI(t, tg, sock)
		cfg := vmConfig(t, dir, `,"net":[{"tap":"vmcf0","mac":"52:54:00:aa:bb:cc","id":"n0"}]`)
		wantNoContent(t, "vm.create", call(t, sock, "PUT", "vm.create", cfg))
		r := call(t, sock, "GET", "vm.info", "")
		var info struct {
			Config struct {
				Net []map[string]any `json:"net"`
			} `json:"config"`
		}
		if err := json.Unmarshal(r.body, &info); err != nil || len(info.Config.Net) != 1 {
			t.Fatalf("vm.info: %s (%v)", r.body, err)
		}
		n := info.Config.Net[0]
		t.Logf("net config as vm.info shows it: %v", n)
		if n["tap"] != "vmcf0" || n["mac"] != "52:54:00:aa:bb:cc" || n["id"] != "n0" {
			t.Errorf("net config: %v", n)
		}
		if ip, ok := n["ip"].(string); ok && ip != "" && !strings.HasPrefix(ip, "192.168.249.") {
			t.Errorf("ip %q appeared from nowhere", ip)
		}
	})
}
