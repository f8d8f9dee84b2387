package vmnet

import (
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/cidata"
)

func TestPlanNICGivesEachVMItsOwnSlash30(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 256; i++ {
		nic, gi, guest, err := PlanNIC("192.168.200.0/22", i, "tap0")
		if err != nil {
			t.Fatal(err)
		}
		if seen[guest] || seen[nic.MAC] {
			t.Fatalf("index %d: guest %s or MAC %s reused", i, guest, nic.MAC)
		}
		seen[guest], seen[nic.MAC] = true, true
		if gi.MAC != nic.MAC || gi.Gateway != nic.IP || gi.Address != guest+"/30" || nic.Mask != "255.255.255.252" {
			t.Fatalf("index %d: nic %+v guest %+v", i, nic, gi)
		}
		// The plan must be something the seed accepts.
		c := cidata.CloudInit{Hostname: "h", SSHAuthorizedKeys: []string{"k"}, Interfaces: []cidata.GuestInterface{gi}}
		if _, err := c.Files(); err != nil {
			t.Fatalf("index %d: seed refuses the plan: %v", i, err)
		}
	}
	nic, _, guest, _ := PlanNIC("192.168.200.0/22", 1, "tap1")
	if nic.IP != "192.168.200.5" || guest != "192.168.200.6" || nic.MAC != "52:54:00:a8:c8:06" {
		t.Fatalf("index 1: %+v %s", nic, guest)
	}
	for _, bad := range []struct {
		pool string
		i    int
	}{{"192.168.200.0/22", 256}, {"192.168.200.0/22", -1}, {"10.0.0.0/31", 0}, {"fd00::/64", 0}, {"nope", 0}} {
		if _, _, _, err := PlanNIC(bad.pool, bad.i, "t"); err == nil || !strings.Contains(err.Error(), "plan nic") {
			t.Errorf("PlanNIC(%q, %d): %v", bad.pool, bad.i, err)
		}
	}
}
