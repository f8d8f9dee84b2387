package nodeagent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// listingManager is a manager binary that logs its argv, answers the two
// lists with an empty JSON list and fails every other verb, so each agent
// path below runs up to its first write verb and stops there.
func listingManager(t *testing.T) (bin, log string) {
	dir := t.TempDir()
	bin, log = filepath.Join(dir, "mgr"), filepath.Join(dir, "calls")
	script := "#!/bin/sh\necho \"$*\" >>" + log + "\n" +
		"case \"$*\" in 'vm list -o json'|'snapshot list -o json') echo '[]'; exit 0;; esac\n" +
		"echo 'Error: boom' >&2\nexit 1\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, log
}

// TestAdapterArgvIsVMCtlsOwn: every verb the agent runs goes through the
// adapter (manager.Manager.Command), and over vmctl its argv is the one the
// agent ran before issue 33, so the agent.child.exec/exit trace the injector
// and checkers read is unchanged. Each line below is the old hand-built argv
// of one agent path (vmctl.go, ops.go, eject.go, snapshot.go, watch.go at
// 0f19cbf).
func TestAdapterArgvIsVMCtlsOwn(t *testing.T) {
	ctx := context.Background()
	a, _ := planAgent(t, nil)
	bin, calls := listingManager(t)
	a.cfg.VMCtl = bin
	a.cfg.RegistryDir = t.TempDir()
	if _, err := a.saveSnapshot(ctx, "w", "ID1"); err == nil {
		t.Fatal("save through a failing manager succeeded")
	}
	if err := a.removeSnapshot(ctx, "w", "SNAP1", false); err == nil {
		t.Fatal("rm through a failing manager succeeded")
	}
	if _, err := a.reconcileStaleCreate(ctx, "w", "ID2"); err == nil {
		t.Fatal("reconcile through a failing manager succeeded")
	}
	if _, err := a.inspectVM(ctx, "w", "ID3"); err == nil {
		t.Fatal("inspect through a failing manager succeeded")
	}
	if vms, err := a.listVMs(ctx); err != nil || len(vms) != 0 {
		t.Fatalf("vm list: %v %v", vms, err)
	}
	if _, err := a.cloneLeaseWait(ctx, "w", "SNAP2"); err == nil {
		t.Fatal("clone through a failing manager succeeded")
	}
	if err := a.doUnhibernate(ctx, &record{Name: "w", Status: Status{VMID: "ID4"}}); err == nil {
		t.Fatal("start through a failing manager succeeded")
	}
	if err := a.removeVM(ctx, "w", "ID5"); err == nil {
		t.Fatal("rm through a failing manager succeeded")
	}
	if err := a.netNICs(ctx, "w", "ID6", 0); err == nil {
		t.Fatal("vm net through a failing manager succeeded")
	}
	if err := a.waitReady(ctx, "w", "ID7"); err == nil {
		t.Fatal("vm exec through a failing manager succeeded")
	}
	if err := a.push(ctx, "w", "SNAP3", "img"); err == nil {
		t.Fatal("export through a failing manager succeeded")
	}
	pullFixture(t, a, "w")
	if _, err := a.ensureLocalSnapshot(ctx, &record{Name: "w"}); err == nil {
		t.Fatal("import through a failing manager succeeded")
	}
	if err := a.watchOnce(ctx); err == nil {
		t.Fatal("event stream of a failing manager exited 0")
	}
	want := strings.Join([]string{
		"snapshot save --name w ID1",
		"snapshot rm SNAP1",
		"vm reconcile-stale-create ID2 -o json",
		"vm inspect ID3 -o json",
		"vm list -o json",
		"vm clone --name w --nics 1 SNAP2",
		"vm start ID4",
		"vm rm --force ID5",
		"vm net ID6 --nics 0",
		"vm exec ID7 -- hostname",
		"snapshot export SNAP3 -o REGISTRY/.w.push-N",
		"snapshot list -o json",
		"snapshot import --name w REGISTRY/w.0123456789abcdef.snap",
		"vm status --event --format json -n 1",
	}, "\n")
	got := strings.ReplaceAll(callsOf(t, calls), a.cfg.RegistryDir, "REGISTRY")
	got = regexp.MustCompile(`push-\d+`).ReplaceAllString(got, "push-N")
	got = regexp.MustCompile(`w\.[0-9a-f]{16}\.snap`).ReplaceAllString(got, "w.0123456789abcdef.snap")
	if got != want {
		t.Errorf("argv:\n%s\nwant:\n%s", got, want)
	}
}

// pullFixture puts a verified registry entry of name in the registry dir,
// so a wake gets as far as importing it.
func pullFixture(t *testing.T, a *Agent, name string) {
	t.Helper()
	data := []byte("snapshot archive\n")
	sum := sha256.Sum256(data)
	hexsum := hex.EncodeToString(sum[:])
	file := name + "." + hexsum[:16] + ".snap"
	if err := os.WriteFile(filepath.Join(a.cfg.RegistryDir, file), data, 0o644); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(registryManifest{Name: name, File: file, SHA256: hexsum, Size: int64(len(data)), SnapshotID: "SNAP4"})
	if err := os.WriteFile(a.manifestPath(name), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestKilledSaveIsFollowedByGC: a save child that dies of a signal is
// followed by the manager's gc (its capture would outlive a cancelled
// hibernate otherwise); a save the manager refused is not. The historical
// behaviour (killed-save-not-collected) is proven caught by selftest: the
// switch is read once per process.
func TestKilledSaveIsFollowedByGC(t *testing.T) {
	for _, tc := range []struct {
		name, save string // the manager's answer to snapshot save
		wantGC     bool
	}{
		{"killed", "kill -9 $$", true},
		{"refused", "echo 'Error: boom' >&2; exit 1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := planAgent(t, nil)
			dir := t.TempDir()
			bin, calls := filepath.Join(dir, "mgr"), filepath.Join(dir, "calls")
			script := "#!/bin/sh\necho \"$*\" >>" + calls + "\n" +
				"case \"$*\" in 'snapshot save'*) " + tc.save + ";; gc) exit 0;; esac\necho '[]'\n"
			if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			a.cfg.VMCtl = bin
			if _, err := a.saveSnapshot(context.Background(), "w", "ID1"); err == nil {
				t.Fatal("a save the manager did not finish succeeded")
			}
			b, _ := os.ReadFile(calls)
			gc := strings.Contains("\n"+string(b), "\ngc\n")
			if gc != tc.wantGC {
				t.Fatalf("gc run %v, want %v; calls:\n%s", gc, tc.wantGC, b)
			}
		})
	}
}
