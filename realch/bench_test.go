package realch

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func BenchmarkBuildCIData(b *testing.B) {
	p := filepath.Join(b.TempDir(), "cidata.img")
	c := testCloudInit()
	for b.Loop() {
		if err := BuildCIData(p, c); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPreflightKVM(b *testing.B) {
	var r PreflightResult
	for b.Loop() {
		r = PreflightKVM("")
	}
	b.Logf("verdict here: %s", r)
}

// Launch → vmm.ping answered → Stop (SIGTERM, reaped, files removed), with
// fakech installed as cloud-hypervisor.
func BenchmarkLaunchToReadyAndStop(b *testing.B) {
	r := newFakeRunner(b)
	env, err := Discover(r.opts)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for b.Loop() {
		v, err := Launch(ctx, env, LaunchSpec{Dir: filepath.Join(dir, "vm")})
		if err != nil {
			b.Fatal(err)
		}
		if err := v.Stop(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// The seed volume built in memory, without the durable write.
func BenchmarkBuildFATSeed(b *testing.B) {
	files, err := testCloudInit().Files()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := BuildFAT(CIDataLabel, files); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDHCPExchange: one DISCOVER written into a real TAP's guest end
// and the OFFER read back out of it, through the responder in a namespace.
func BenchmarkDHCPExchange(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	ns, err := NewNetns(uniqueName("vmchaos-b"))
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Close()
	tap := uniqueName("vtb")
	if err := ns.AddTap(tap, "10.77.9.1/30"); err != nil {
		b.Fatal(err)
	}
	d, err := ServeDHCP(ns)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	end := openTapEnd(b, ns, tap)
	disc := dhcpReq(DHCPDiscover, testMAC, nil)
	end.exchange(b, disc) // the first one waits for the carrier
	b.ResetTimer()
	for b.Loop() {
		disc.XID++
		if offer, _ := end.exchange(b, disc); offer.MsgType() != DHCPOffer {
			b.Fatalf("got %+v", offer)
		}
	}
}
