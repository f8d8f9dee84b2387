package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/internal/needs"
	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/scenarios/runner"
)

// recordedCocoon writes an executable that answers `PATH --help` and
// `version` with the pages recorded from a real cocoon build
// (manager/cocoon/testdata/help/<build>, see its README) and fails on a page
// not recorded, as cobra's unknown command would.
func recordedCocoon(t *testing.T, build string) string {
	t.Helper()
	pages, err := filepath.Abs(filepath.Join("..", "..", "manager", "cocoon", "testdata", "help", build))
	if err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`#!/bin/sh
d=%q
case "$*" in
version) exec cat "$d/version.txt" ;;
--help) exec cat "$d/root.txt" ;;
*" --help") p=$(echo "${*%% --help}" | tr ' ' '-'); [ -f "$d/$p.txt" ] || { echo "Error: unknown command" >&2; exit 1; }; exec cat "$d/$p.txt" ;;
esac
echo "Error: not recorded: $*" >&2
exit 1
`, pages)
	bin := filepath.Join(t.TempDir(), "cocoon")
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// `vmchaos manager probe` against a process answering with v0.2.x's real
// pages prints the table: create without -o (the flag that build lacks),
// verb-json missing with the page it is not on, and the version.
func TestManagerProbePrintsV02Table(t *testing.T) {
	bin := recordedCocoon(t, "v02")
	var out bytes.Buffer
	cmd := newManagerCmd()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"probe", "--manager", "cocoon", "--manager-bin", bin})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"version  v0.2.7-1-g21800e2 (git 21800e2e38d4)",
		"create           yes      cocoon vm run --name NAME --nics 0 --cpu 1 --memory 512M vmchaos-guest\n",
		"verb-json        no       vm run: no JSON output flag (-o/--output/--format json) in `cocoon vm run --help`",
		"nic-change       no       vm net: not in `cocoon vm --help`",
		"snapshot-export  yes      cocoon snapshot export SNAP --output FILE\n",
		"15 of 20 present",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}

	out.Reset()
	cmd = newManagerCmd()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"probe", "--manager", "cocoon", "--manager-bin", recordedCocoon(t, "head"), "--json"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	var caps manager.Capabilities
	if err := json.Unmarshal(out.Bytes(), &caps); err != nil {
		t.Fatalf("--json: %v\n%s", err, out.String())
	}
	if it, _ := caps.Get(manager.FeatureVerbJSON); !it.Present || caps.Version != "v0.3.8 (git 34c6c4a8ebdd)" {
		t.Fatalf("head: verb-json %+v, version %q", it, caps.Version)
	}
}

// A binary that is not a cocoon CLI is an error, not a table of missing
// verbs.
func TestManagerProbeRejectsANonCocoon(t *testing.T) {
	cmd := newManagerCmd()
	cmd.SilenceErrors = true
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetArgs([]string{"probe", "--manager", "cocoon", "--manager-bin", "/bin/true"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "`cocoon --help`") {
		t.Fatalf("err = %v", err)
	}
}

// The probe against a real cocoon binary (VMCHAOS_COCOON): the verbs the
// catalogue drives are all present, and the very argv the adapter builds
// for each (and for its event stream) is accepted by that binary's own flag
// parser (`ARGV --help` exits 0; a flag it lacks fails as issue 32's `-o`
// did); its lists read as empty lists on a fresh store.
func TestManagerProbeRealCocoon(t *testing.T) {
	bin := needs.Binary(t, "VMCHAOS_COCOON", "cocoon",
		"build github.com/cocoonstack/cocoon (any release from v0.2.x) and set VMCHAOS_COCOON to the binary")
	dir := t.TempDir()
	m, err := runner.NewManager("cocoon", manager.Options{Bin: bin, Dir: dir, VMMDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	caps, err := manager.CapabilitiesOf(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if caps.Version == "" || strings.HasPrefix(caps.Version, "unknown (") {
		t.Errorf("version %q", caps.Version)
	}
	for _, v := range []manager.Verb{manager.VerbCreate, manager.VerbClone, manager.VerbSnapshotSave, manager.VerbSnapshotRm,
		manager.VerbStart, manager.VerbStop, manager.VerbRm, manager.VerbGC} {
		if ok, why := caps.Supports(string(v)); !ok {
			t.Errorf("%s: %s", v, why)
			continue
		}
		argv, err := m.Command(manager.Call{Verb: v, VM: "vm1", Snapshot: "snap1", Name: "new1"})
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		acceptsFlags(t, m, argv)
	}
	if ok, _ := caps.Supports(string(manager.VerbRestore)); ok {
		argv, _ := m.Command(manager.Call{Verb: manager.VerbRestore, VM: "vm1", Snapshot: "snap1"})
		acceptsFlags(t, m, argv)
	}
	acceptsFlags(t, m, m.EventCommand())
	if vms, err := m.VMs(ctx); err != nil || len(vms) != 0 {
		t.Errorf("VMs on a fresh store: %v %v", vms, err)
	}
	if ss, err := m.Snapshots(ctx); err != nil || len(ss) != 0 {
		t.Errorf("Snapshots on a fresh store: %v %v", ss, err)
	}
	t.Logf("cocoon %s: %d of %d capabilities present", caps.Version, len(caps.Items)-len(caps.Missing()), len(caps.Items))
}

// acceptsFlags runs argv with --help appended: cobra parses every flag
// first, so an unknown one fails, and help then exits 0 without acting.
func acceptsFlags(t *testing.T, m manager.Manager, argv []string) {
	t.Helper()
	cmd := exec.Command(argv[0], append(argv[1:], "--help")...)
	cmd.Env = m.Env()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%q --help: %v: %s", argv, err, lastLine(out))
	}
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}
