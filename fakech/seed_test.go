package fakech

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/cidata"
)

func TestSeedAddrsReadsRealchSeeds(t *testing.T) {
	p := filepath.Join(t.TempDir(), "cidata.img")
	if err := cidata.BuildCIData(p, cidata.CloudInit{Hostname: "h", SSHAuthorizedKeys: []string{"ssh-ed25519 AAAA k"},
		Interfaces: []cidata.GuestInterface{{MAC: "52:54:00:AA:00:01", Address: "127.1.2.3/30"}, {MAC: "52:54:00:aa:00:02", Address: "10.0.0.2/24"}}}); err != nil {
		t.Fatal(err)
	}
	got := seedAddrs(&chapi.VmConfig{Disks: []chapi.DiskConfig{{Path: "/nonexistent"}, {Path: p}}})
	if len(got) != 2 || got["52:54:00:aa:00:01"] != "127.1.2.3" || got["52:54:00:aa:00:02"] != "10.0.0.2" {
		t.Fatalf("seed addresses %v", got)
	}
}

// FuzzSeedFAT: arbitrary bytes as a seed volume never panic.
func FuzzSeedFAT(f *testing.F) {
	p := filepath.Join(f.TempDir(), "cidata.img")
	if err := cidata.BuildCIData(p, cidata.CloudInit{Hostname: "h", SSHAuthorizedKeys: []string{"ssh-ed25519 AAAA k"},
		Interfaces: []cidata.GuestInterface{{MAC: "52:54:00:aa:00:01", Address: "127.1.2.3/30"}}}); err != nil {
		f.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	f.Add(b)
	f.Fuzz(func(t *testing.T, img []byte) {
		if nc, ok := fatFile(img, "network-config"); ok {
			_ = parseNetworkConfig(nc)
		}
	})
}
