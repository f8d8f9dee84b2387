package cocoon

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/manager"
)

// TestInRootResolvesLinksInsideTheRoot: /var/run → /run under another
// root must lead to that root's /run, as the process there sees it.
func TestInRootResolvesLinksInsideTheRoot(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"run/netns", "var"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/run", filepath.Join(root, "var", "run")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../run", filepath.Join(root, "rel")); err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		"/var/run/netns/cocoon-X": root + "/run/netns/cocoon-X",
		"/rel/netns":              root + "/run/netns",
		"/run/netns":              root + "/run/netns",
	} {
		if got, err := InRoot(root, in); err != nil || got != want {
			t.Errorf("InRoot(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
	if err := os.Symlink("loop", filepath.Join(root, "loop")); err != nil {
		t.Fatal(err)
	}
	if _, err := InRoot(root, "/loop/x"); err == nil {
		t.Error("a symlink loop resolved")
	}
	if _, err := InRoot(root, "relative"); err == nil {
		t.Error("a relative path resolved")
	}
}

// withPluginDir points the adapter's networking at dir for one test.
func withPluginDir(t *testing.T, dir string) {
	t.Helper()
	old := NetPluginDir
	t.Cleanup(func() { NetPluginDir = old })
	NetPluginDir = dir
}

// TestGuestNetOnlyWithThePlugins: the adapter is a GuestNet (the workload
// cases' guest reachable) only where the host has the CNI plugins (and
// root); without them GuestNetOf names the missing plugin and the package,
// and a Setup asked for a NIC pool refuses with that reason before it
// starts anything: never a store whose VMs silently get no NIC.
func TestGuestNetOnlyWithThePlugins(t *testing.T) {
	empty := t.TempDir()
	withPluginDir(t, empty)
	dir, err := os.MkdirTemp("", "gn") // short: the adapter refuses a run dir too long for sockets
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	a := New(manager.Options{Bin: "/nonexistent/cocoon", Dir: dir, NetPool: "127.1.2.0/24"})
	ok, why := manager.GuestNetOf(a)
	if ok {
		t.Fatal("GuestNet without any CNI plugin")
	}
	if os.Geteuid() == 0 && (!strings.Contains(why, "bridge") || !strings.Contains(why, CNIPackage)) {
		t.Fatalf("reason %q: want the bridge plugin and %s named", why, CNIPackage)
	}
	if os.Geteuid() != 0 && !strings.Contains(why, "root") {
		t.Fatalf("reason %q as a user: want root named", why)
	}
	err = a.Setup(context.Background())
	if err == nil || !strings.Contains(err.Error(), why) {
		t.Fatalf("Setup with a NIC pool and no plugins: %v; want the preflight's reason %q", err, why)
	}
	if a.net != nil || len(a.HarnessPIDs()) != 0 {
		t.Fatal("a net holder was started without the plugins")
	}
	if _, err := os.Stat(filepath.Join(a.opts.Dir, "cocoon-in-ns")); !os.IsNotExist(err) {
		t.Fatalf("the wrapper was written without the plugins: %v", err)
	}

	full := t.TempDir()
	for _, p := range CNIPlugins {
		if err := os.WriteFile(filepath.Join(full, p), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	withPluginDir(t, full)
	ok, why = manager.GuestNetOf(a)
	if os.Geteuid() == 0 && (!ok || why != "") {
		t.Fatalf("GuestNetOf with the plugins, as root: %v %q; want yes", ok, why)
	}
	if os.Geteuid() != 0 && ok {
		t.Fatal("GuestNet as a user: the netns, bridge and TAPs need root")
	}
}

// TestWriteCNIConfIsTheCasesPool: the conflist cocoon reads names the
// case's pool, keeps IPAM's state in the case's store, and the plugins are
// linked from the plugin dir into the bin dir the adapter's Env names.
func TestWriteCNIConfIsTheCasesPool(t *testing.T) {
	dir, plugins := t.TempDir(), t.TempDir()
	for _, d := range []string{"cni/net.d", "cni/bin"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := WriteCNIConf(dir, "127.9.3.0/24", plugins); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "cni", "net.d", "10-vmchaos.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Name    string `json:"name"`
		Plugins []struct {
			Type string `json:"type"`
			IPAM struct {
				Type    string                `json:"type"`
				DataDir string                `json:"dataDir"`
				Ranges  [][]map[string]string `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatal(err)
	}
	if len(conf.Plugins) != 1 || conf.Plugins[0].Type != "bridge" || conf.Plugins[0].IPAM.Type != "host-local" ||
		conf.Plugins[0].IPAM.Ranges[0][0]["subnet"] != "127.9.3.0/24" || !strings.HasPrefix(conf.Plugins[0].IPAM.DataDir, dir) {
		t.Fatalf("conflist: %s", b)
	}
	env := strings.Join(New(manager.Options{Dir: dir}).Env(), "\n")
	for _, p := range CNIPlugins {
		link := filepath.Join(dir, "cni", "bin", p)
		if got, err := os.Readlink(link); err != nil || got != filepath.Join(plugins, p) {
			t.Errorf("plugin %s: %q %v", p, got, err)
		}
	}
	if !strings.Contains(env, "COCOON_CNI_CONF_DIR="+filepath.Join(dir, "cni", "net.d")) || !strings.Contains(env, "COCOON_CNI_BIN_DIR="+filepath.Join(dir, "cni", "bin")) {
		t.Fatalf("env does not point cocoon at the conflist: %s", env)
	}
}

// TestGuestNetNeedsTheCNIDirFlags: with the plugins (as root), each
// recorded build is a GuestNet; a build whose root help lacks
// --cni-conf-dir is not, and the reason names the missing flag.
func TestGuestNetNeedsTheCNIDirFlags(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the CNI preflight needs root before the flags are asked")
	}
	full := t.TempDir()
	for _, p := range CNIPlugins {
		if err := os.WriteFile(filepath.Join(full, p), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	withPluginDir(t, full)
	for _, b := range builds {
		if ok, why := manager.GuestNetOf(recorded(t, b, manager.Options{Bin: "/nonexistent/cocoon-" + b})); !ok {
			t.Errorf("%s: not a GuestNet: %s", b, why)
		}
	}
	a := recorded(t, "head", manager.Options{Bin: "/nonexistent/cocoon-nocni"})
	pages := a.help
	a.help = func(ctx context.Context, path string) (string, error) {
		s, err := pages(ctx, path)
		if path != "" {
			return s, err
		}
		var keep []string
		for _, l := range strings.Split(s, "\n") {
			if !strings.Contains(l, "cni-conf-dir") {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n"), err
	}
	if ok, why := manager.GuestNetOf(a); ok || !strings.Contains(why, "cni-conf-dir") {
		t.Fatalf("a build without --cni-conf-dir: GuestNet %v (%q); want no, naming the flag", ok, why)
	}
}
