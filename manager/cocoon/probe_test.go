package cocoon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/manager"
)

// The help pages under testdata/help/<build>/ are the real output of
// `cocoon PATH --help` and `cocoon version` of three builds of
// github.com/cocoonstack/cocoon (testdata/README.md): v02 = v0.2.7-1-g21800e2
// (21800e2e38d4, seed 000's release), v03 = v0.3.0 (4fee6604a650), head =
// v0.3.8 (34c6c4a8ebdd).
var builds = []string{"v02", "v03", "head"}

// recordedHelp reads testdata/help/<build>/<path with dashes>.txt, or
// root.txt for the root; a page not recorded fails as a binary would.
func recordedHelp(build string) HelpFunc {
	return func(_ context.Context, path string) (string, error) {
		name := strings.ReplaceAll(path, " ", "-")
		if name == "" {
			name = "root"
		}
		b, err := os.ReadFile(filepath.Join("testdata", "help", build, name+".txt"))
		if err != nil {
			return "", fmt.Errorf("exit 1: Error: no recorded page %s: %w", name, err)
		}
		return string(b), nil
	}
}

// recorded is an adapter whose binary answers with build's recorded pages.
func recorded(t *testing.T, build string, o manager.Options) *Adapter {
	t.Helper()
	a := New(o)
	a.help = recordedHelp(build)
	a.version = func(context.Context) (string, error) {
		b, err := os.ReadFile(filepath.Join("testdata", "help", build, "version.txt"))
		return string(b), err
	}
	return a
}

func TestParseHelpReadsCommandsAndFlags(t *testing.T) {
	h := ParseHelp(string(read(t, "help/head/vm-run.txt")))
	if f := h.Flags["output"]; f.Short != "o" || f.Type != "string" || f.Global || !strings.Contains(f.Usage, `"json"`) {
		t.Fatalf("--output: %+v", f)
	}
	if f := h.Flags["windows"]; f.Type != "" || f.Usage == "" {
		t.Fatalf("bool --windows: %+v", f)
	}
	if f := h.Flags["cni-conf-dir"]; !f.Global {
		t.Fatalf("--cni-conf-dir should be global: %+v", f)
	}
	vm := ParseHelp(string(read(t, "help/head/vm.txt")))
	want := []string{"clone", "console", "create", "debug", "inspect", "list", "restore", "rm", "run", "start", "status", "stop"}
	if !reflect.DeepEqual(vm.Commands, want) {
		t.Fatalf("vm commands %q, want %q", vm.Commands, want)
	}
}

// The JSON flag of each page as each build has it: none on a v0.2.x/v0.3.0
// lifecycle verb (the `unknown shorthand flag: 'o' in -o` of issue 32),
// --output on HEAD's, --format on the lists and vm status, and never
// snapshot export's -o (a file path).
func TestJSONFlagPerBuild(t *testing.T) {
	for _, tc := range []struct {
		build, page, want string
	}{
		{"v02", "vm-run", ""}, {"v02", "vm-clone", ""}, {"v02", "vm-restore", ""},
		{"v03", "vm-run", ""}, {"v03", "vm-clone", ""},
		{"head", "vm-run", "--output"}, {"head", "vm-clone", "--output"}, {"head", "vm-restore", "--output"},
		{"v02", "vm-list", "--format"}, {"head", "snapshot-list", "--format"}, {"v02", "vm-status", "--format"},
		{"head", "snapshot-export", ""},
	} {
		got, _ := ParseHelp(string(read(t, "help/"+tc.build+"/"+tc.page+".txt"))).JSONFlag()
		if got != tc.want {
			t.Errorf("%s %s: JSON flag %q, want %q", tc.build, tc.page, got, tc.want)
		}
	}
}

// Each build's capability table, from its real help pages: what is present,
// and for each missing row the exact reason naming the page it is not in.
func TestProbeCapabilitiesPerBuild(t *testing.T) {
	missing := map[string]map[string]string{
		"v02": {
			manager.FeatureVerbJSON: "vm run: no JSON output flag (-o/--output/--format json) in `cocoon vm run --help`",
		},
		"v03": {
			manager.FeatureVerbJSON: "vm run: no JSON output flag (-o/--output/--format json) in `cocoon vm run --help`",
		},
		"head": {},
	}
	const vmVerbs = "clone console create debug inspect list restore rm run start status stop" // the same on all three
	versions := map[string]string{"v02": "v0.2.7-1-g21800e2 (git 21800e2e38d4)", "v03": "v0.3.0 (git 4fee6604a650)", "head": "v0.3.8 (git 34c6c4a8ebdd)"}
	for _, b := range builds {
		caps, err := recorded(t, b, manager.Options{Bin: "/x/cocoon-" + b}).Capabilities(context.Background())
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if caps.Version != versions[b] {
			t.Errorf("%s: version %q, want %q", b, caps.Version, versions[b])
		}
		var names []string
		for _, it := range caps.Items {
			names = append(names, it.Name)
		}
		if !reflect.DeepEqual(names, manager.CapabilityNames) {
			t.Fatalf("%s: rows %q, want %q", b, names, manager.CapabilityNames)
		}
		want := map[string]string{
			string(manager.VerbRecoverStale): "recover-stale: cocoon has no verb for a `creating` record whose owner died: none of `cocoon vm --help`'s [" + vmVerbs + "] is one",
			manager.FeatureNIC:               "vm net: not in `cocoon vm --help`",
			manager.FeatureGuestExec:         "vm exec: not in `cocoon vm --help`",
			manager.FeatureCheck:             "check: not in `cocoon --help`",
		}
		for k, v := range missing[b] {
			want[k] = v
		}
		got := map[string]string{}
		for _, it := range caps.Missing() {
			got[it.Name] = it.Reason
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: missing\n got %q\nwant %q", b, got, want)
		}
		for _, it := range caps.Items {
			if it.Present && it.How == "" {
				t.Errorf("%s: %s present without its form", b, it.Name)
			}
		}
	}
}

// The v0.2.x failure: the adapter passed -o to `vm run`. Against
// each build's pages it now passes a JSON flag only where the build has
// one, and every flag it passes is on that verb's page.
func TestCommandFitsEachBuild(t *testing.T) {
	calls := []manager.Call{
		{Verb: manager.VerbCreate, Name: "src"}, {Verb: manager.VerbClone, Snapshot: "base", Name: "tgt"},
		{Verb: manager.VerbRestore, VM: "src", Snapshot: "base"}, {Verb: manager.VerbSnapshotSave, VM: "src", Name: "s"},
		{Verb: manager.VerbSnapshotRm, Snapshot: "s"}, {Verb: manager.VerbStart, VM: "src"}, {Verb: manager.VerbStop, VM: "src"},
		{Verb: manager.VerbRm, VM: "src"}, {Verb: manager.VerbGC},
	}
	for _, b := range builds {
		a := recorded(t, b, manager.Options{Bin: "/x/cocoon"})
		for _, c := range calls {
			argv, err := a.Command(c)
			if err != nil {
				t.Fatalf("%s %s: %v", b, c, err)
			}
			assertFlagsOnPage(t, b, argv[1:])
		}
		assertFlagsOnPage(t, b, a.EventCommand()[1:])
		create, _ := a.Command(calls[0])
		hasJSON := strings.Contains(strings.Join(create, " "), "--output json")
		if hasJSON != (b == "head") {
			t.Errorf("%s: create %q: --output json present=%v", b, create, hasJSON)
		}
	}
}

// assertFlagsOnPage: every --long and -s flag of args (a cocoon argv
// without argv[0]) is on the help page of its command path.
func assertFlagsOnPage(t *testing.T, build string, args []string) {
	t.Helper()
	var path []string
	for _, w := range args {
		if strings.HasPrefix(w, "-") {
			break
		}
		path = append(path, w)
		if len(path) == 2 || w == "gc" {
			break
		}
	}
	h := ParseHelp(string(read(t, "help/"+build+"/"+strings.Join(path, "-")+".txt")))
	shorts := map[string]bool{}
	for _, f := range h.Flags {
		shorts[f.Short] = f.Short != ""
	}
	for _, w := range args {
		if long, ok := strings.CutPrefix(w, "--"); ok {
			if _, ok := h.Flags[long]; !ok {
				t.Errorf("%s: %q passes --%s, not on `cocoon %s --help`", build, args, long, strings.Join(path, " "))
			}
		} else if short, ok := strings.CutPrefix(w, "-"); ok && !shorts[short] {
			t.Errorf("%s: %q passes -%s, not on `cocoon %s --help`", build, args, short, strings.Join(path, " "))
		}
	}
}

// A help page that cannot be read makes only the capabilities that need it
// missing, with the error; the rest of the table stands (issue 32: one
// verb's discovery failure must not abort the others).
func TestProbeOnePageFailingKeepsTheOthers(t *testing.T) {
	a := recorded(t, "head", manager.Options{Bin: "/x/cocoon"})
	inner := a.help
	a.help = func(ctx context.Context, path string) (string, error) {
		if path == "vm clone" {
			return "", errors.New("exit 2: boom")
		}
		return inner(ctx, path)
	}
	caps, err := a.Capabilities(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ok, why := caps.Supports(string(manager.VerbClone))
	if ok || why != manager.NotSupportedPrefix+"vm clone: `cocoon vm clone --help` failed: exit 2: boom" {
		t.Fatalf("clone: %v %q", ok, why)
	}
	if ok, why := caps.Supports(string(manager.VerbCreate), string(manager.VerbSnapshotSave), manager.FeatureEvents); !ok {
		t.Fatalf("the others went with it: %s", why)
	}
	if _, err := a.Command(manager.Call{Verb: manager.VerbClone, Snapshot: "b", Name: "n"}); !errors.Is(err, manager.ErrNotSupported) ||
		!strings.Contains(err.Error(), "boom") {
		t.Fatalf("Command(clone) = %v, want ErrNotSupported naming the failure", err)
	}
	if _, err := a.Command(manager.Call{Verb: manager.VerbCreate, Name: "n"}); err != nil {
		t.Fatalf("Command(create): %v", err)
	}
}

// A binary whose root help is unreadable is not a cocoon the adapter can
// drive: that is an error, never a table of missing verbs read as "not
// supported".
func TestProbeUnreadableRootIsAnError(t *testing.T) {
	a := New(manager.Options{Bin: "/x/not-cocoon"})
	a.help = func(context.Context, string) (string, error) { return "hello\n", nil }
	a.version = func(context.Context) (string, error) { return "", errors.New("exit 1") }
	if _, err := a.Capabilities(context.Background()); err == nil || !strings.Contains(err.Error(), "no Flags section") {
		t.Fatalf("Capabilities = %v, want the unreadable root named", err)
	}
	if _, err := a.Command(manager.Call{Verb: manager.VerbCreate, Name: "n"}); err == nil || errors.Is(err, manager.ErrNotSupported) {
		t.Fatalf("Command = %v, want an error that is not ErrNotSupported", err)
	}
}

// A v0.2.x list may follow the release's own log lines on stdout (its
// cmd/root.go logs to stdout); those lines are dropped, anything else that
// is not JSON still fails.
func TestParseVMsAfterV02LogLines(t *testing.T) {
	out := append(read(t, "v02-vm-run-stdout.txt"), read(t, "v02-vm-list.json")...)
	vms, err := ParseVMs(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(vms) != 1 || vms[0].Name != "src" || vms[0].State != "running" || vms[0].ID == "" {
		t.Fatalf("got %+v", vms)
	}
	if _, err := ParseVMs(append([]byte("some other line\n"), read(t, "v02-vm-list.json")...)); err == nil {
		t.Fatal("a line that is not cocoon's log was dropped")
	}
	if _, err := ParseVMs(read(t, "v02-vm-run-stdout.txt")); err == nil {
		t.Fatal("log lines alone read as a list")
	}
}

// With `cocoon vm --help` unreadable, every vm verb is missing naming that
// page, and the snapshot verbs, gc and the global flags stand.
func TestProbeVMPageFailingKeepsSnapshotVerbs(t *testing.T) {
	a := recorded(t, "v02", manager.Options{Bin: "/x/cocoon"})
	inner := a.help
	a.help = func(ctx context.Context, path string) (string, error) {
		if path == "vm" {
			return "", errors.New("exit 1: boom")
		}
		return inner(ctx, path)
	}
	caps, err := a.Capabilities(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{string(manager.VerbCreate), string(manager.VerbClone), string(manager.VerbRecoverStale), manager.FeatureEvents} {
		if ok, why := caps.Supports(n); ok || !strings.Contains(why, "`cocoon vm --help` failed: exit 1: boom") {
			t.Errorf("%s: %v %q", n, ok, why)
		}
	}
	if ok, why := caps.Supports(string(manager.VerbSnapshotSave), string(manager.VerbSnapshotRm), string(manager.VerbGC), manager.FeatureCNIDirs); !ok {
		t.Fatalf("the others went with it: %s", why)
	}
}
