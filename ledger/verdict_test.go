package ledger

import (
	"reflect"
	"strings"
	"testing"
)

func intent(g, m string) Entry { return Entry{Kind: KindIntent, Guest: g, Marker: m} }
func acked(g, m, boot string) Entry {
	return Entry{Kind: KindAcked, Guest: g, Marker: m, BootID: boot}
}
func bootID(g, boot string) Entry { return Entry{Kind: KindBootID, Guest: g, BootID: boot} }

func TestClassify(t *testing.T) {
	journal := []Entry{
		intent("g", "m1"), acked("g", "m1", "b1"),
		intent("g", "m2"), acked("g", "m2", "b1"),
		intent("g", "m3"), // interrupted before the ack
		intent("other", "o1"), acked("other", "o1", "x"),
		bootID("g", "b1"),
	}
	cases := []struct {
		name       string
		obs        Observed
		ok         bool
		stable     int
		lost       []string
		phantom    []string
		inflight   int
		ramMissing []string
		bootChange bool
		inherited  int
		msg        string
	}{
		{name: "all present, in-flight absent", obs: Observed{Disk: []string{"m1", "m2"}},
			ok: true, stable: 2, inflight: 1, msg: "2 stable, 1 in-flight"},
		{name: "in-flight present is fine too", obs: Observed{Disk: []string{"m1", "m2", "m3"}},
			ok: true, stable: 2, inflight: 1},
		{name: "acked marker missing is LOST", obs: Observed{Disk: []string{"m2"}},
			stable: 1, lost: []string{"m1"}, inflight: 1, msg: "LOST 1 acked marker(s)"},
		{name: "unjournaled file is PHANTOM", obs: Observed{Disk: []string{"m1", "m2", "zz"}},
			stable: 2, phantom: []string{"zz"}, inflight: 1, msg: "PHANTOM 1 marker(s)"},
		{name: "another guest's marker is inherited, not phantom", obs: Observed{Disk: []string{"m1", "m2", "o1"}},
			ok: true, stable: 2, inflight: 1, inherited: 1},
		{name: "restored memory: RAM and boot id intact",
			obs: Observed{Disk: []string{"m1", "m2"}, RAM: []string{"m1", "m2"}, BootID: "b1", CheckRAM: true},
			ok:  true, stable: 2, inflight: 1, msg: "RAM markers and boot id survived"},
		{name: "fresh boot over the hibernate snapshot",
			obs:    Observed{Disk: []string{"m1", "m2"}, BootID: "b2", CheckRAM: true},
			stable: 2, inflight: 1, ramMissing: []string{"m1", "m2"}, bootChange: true,
			msg: "the wake booted fresh over a hibernate snapshot: boot id changed b1 → b2 and 2 RAM marker(s) are gone"},
		{name: "declared cold boot is reported, not failed",
			obs: Observed{Disk: []string{"m1", "m2"}, BootID: "b2", CheckRAM: true, ColdBootAllowed: "VMM killed"},
			ok:  true, stable: 2, inflight: 1, ramMissing: []string{"m1", "m2"}, bootChange: true,
			msg: "boot id changed b1 → b2 and 2 RAM marker(s) went with it, accepted: VMM killed"},
		{name: "declared cold boot does not excuse lost disk markers",
			obs:    Observed{Disk: []string{"m2"}, BootID: "b2", CheckRAM: true, ColdBootAllowed: "VMM killed"},
			stable: 1, lost: []string{"m1"}, inflight: 1, ramMissing: []string{"m1", "m2"}, bootChange: true, msg: "LOST"},
		{name: "declared cold boot does not excuse RAM loss without a reboot",
			obs:    Observed{Disk: []string{"m1", "m2"}, RAM: []string{"m2"}, BootID: "b1", CheckRAM: true, ColdBootAllowed: "VMM killed"},
			stable: 2, inflight: 1, ramMissing: []string{"m1"}, msg: "memory not restored intact"},
		{name: "RAM marker gone with the same boot id",
			obs:    Observed{Disk: []string{"m1", "m2"}, RAM: []string{"m2"}, BootID: "b1", CheckRAM: true},
			stable: 2, inflight: 1, ramMissing: []string{"m1"}, msg: "memory not restored intact"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := Classify("g", journal, c.obs)
			if v.OK != c.ok || v.Stable != c.stable || v.InFlight != c.inflight || v.Inherited != c.inherited ||
				!reflect.DeepEqual(v.LostNames, c.lost) || !reflect.DeepEqual(v.PhantomNames, c.phantom) ||
				!reflect.DeepEqual(v.RAMMissing, c.ramMissing) || v.BootIDChanged != c.bootChange ||
				v.Lost != len(c.lost) || v.Phantom != len(c.phantom) {
				t.Fatalf("verdict %+v", v)
			}
			if !strings.Contains(v.Message, c.msg) {
				t.Fatalf("message %q lacks %q", v.Message, c.msg)
			}
		})
	}
}

// TestClassifyRAMBaselineFollowsLegitimateReboot: markers acked before a
// crash-and-boot that happened before the hibernate are not expected in RAM;
// only those acked under the boot id recorded before the hibernate are.
func TestClassifyRAMBaselineFollowsLegitimateReboot(t *testing.T) {
	journal := []Entry{
		acked("g", "old", "b1"),
		bootID("g", "b2"), // the VMM crashed and was booted again before the hibernate
		acked("g", "new", "b2"),
	}
	v := Classify("g", journal, Observed{Disk: []string{"old", "new"}, RAM: []string{"new"}, BootID: "b2", CheckRAM: true})
	if !v.OK {
		t.Fatalf("verdict %+v", v)
	}
	v = Classify("g", journal, Observed{Disk: []string{"old", "new"}, RAM: nil, BootID: "b2", CheckRAM: true})
	if v.OK || !reflect.DeepEqual(v.RAMMissing, []string{"new"}) {
		t.Fatalf("verdict %+v", v)
	}
}

// TestClassifyForgetRetiresTheOldMachine: after Forget, a new machine under
// the same name is not held to the old markers or boot id, and old marker
// files that a clone carried over are not phantoms.
func TestClassifyForgetRetiresTheOldMachine(t *testing.T) {
	journal := []Entry{
		acked("g", "old", "b1"),
		{Kind: KindForget, Guest: "g"},
		acked("g", "new", "b9"),
	}
	v := Classify("g", journal, Observed{Disk: []string{"new", "old"}, RAM: []string{"new"}, BootID: "b9", CheckRAM: true})
	if !v.OK || v.Stable != 1 || v.Inherited != 1 {
		t.Fatalf("verdict %+v", v)
	}
	v = Classify("g", journal[:1], Observed{Disk: nil})
	if v.OK || v.Lost != 1 {
		t.Fatalf("without forget the old marker is lost: %+v", v)
	}
}

// TestClassifyNeedsAnAckedMarker (issue #31): a guest whose journal holds no
// acked marker of its own — none at all, only an interrupted intent, only
// another guest's, or only markers retired by a Forget — proves nothing and
// is not OK, whatever the listing shows.
func TestClassifyNeedsAnAckedMarker(t *testing.T) {
	for _, tc := range []struct {
		name    string
		journal []Entry
	}{
		{"empty journal", nil},
		{"an intent never acked", []Entry{intent("g", "m1")}},
		{"only another guest's markers", []Entry{intent("other", "o1"), acked("other", "o1", "x")}},
		{"only a boot id", []Entry{bootID("g", "b1")}},
		{"markers retired by a forget", []Entry{intent("g", "m1"), acked("g", "m1", "b1"), {Kind: KindForget, Guest: "g"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, obs := range []Observed{{}, {Disk: []string{"m1"}}, {CheckRAM: true, BootID: "b1"}} {
				v := Classify("g", tc.journal, obs)
				if v.OK || !strings.Contains(v.Message, "no acked marker") {
					t.Errorf("listing %+v: OK=%v %q, want not OK naming the missing marker", obs, v.OK, v.Message)
				}
			}
		})
	}
}
