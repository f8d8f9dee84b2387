package realch

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// isolate hides this machine's environment from discovery: no env vars, an
// empty PATH dir, no well-known places.
func isolate(t *testing.T) {
	t.Helper()
	for _, e := range []string{EnvCHBinary, EnvFirmware, EnvKernel, EnvInitramfs, EnvImage} {
		t.Setenv(e, "")
	}
	t.Setenv("PATH", t.TempDir())
	old := wellKnown
	wellKnown = func() map[string][]string { return map[string][]string{} }
	t.Cleanup(func() { wellKnown = old })
}

// fakeCH writes an executable script named cloud-hypervisor printing out for
// --version, as CH does.
func fakeCH(t *testing.T, dir, out string) string {
	t.Helper()
	p := filepath.Join(dir, CHName)
	script := "#!/bin/sh\nif [ \"$1\" = --version ] || [ \"$1\" = -V ]; then printf '%s\\n' '" + out + "'; exit 0; fi\nexit 2\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func touch(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(name), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDiscoverNamesEverythingMissingAtOnce(t *testing.T) {
	isolate(t)
	_, err := Discover(Options{})
	var me *MissingError
	if !errors.As(err, &me) || !errors.Is(err, ErrMissing) {
		t.Fatalf("err %v: want a MissingError", err)
	}
	msg := err.Error()
	for _, want := range []string{"cloud-hypervisor binary", EnvCHBinary, "boot payload", EnvFirmware, EnvKernel, "guest disk image", EnvImage} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if len(me.Items) != 3 {
		t.Fatalf("items %q: want binary, payload, image", me.Items)
	}
}

func TestDiscoverFindsPathEnvAndOptions(t *testing.T) {
	isolate(t)
	bin := t.TempDir()
	fakeCH(t, bin, "cloud-hypervisor v48.0-12-g1234abcd-dirty")
	t.Setenv("PATH", bin)
	files := t.TempDir()
	fw := touch(t, files, "CLOUDHV.fd")
	img := touch(t, files, "guest.raw")
	t.Setenv(EnvFirmware, fw)

	env, err := Discover(Options{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	want := Env{CHBinary: filepath.Join(bin, CHName), CHVersion: "v48.0-12-g1234abcd-dirty", Firmware: fw, Image: img}
	if *env != want {
		t.Fatalf("got %+v\nwant %+v", *env, want)
	}
}

func TestDiscoverKernelWithInitramfsFromEnv(t *testing.T) {
	isolate(t)
	dir := t.TempDir()
	ch := fakeCH(t, dir, "cloud-hypervisor v53.0")
	k := touch(t, dir, "vmlinux")
	i := touch(t, dir, "initrd")
	img := touch(t, dir, "img")
	t.Setenv(EnvCHBinary, ch)
	t.Setenv(EnvKernel, k)
	t.Setenv(EnvInitramfs, i)
	t.Setenv(EnvImage, img)
	env, err := Discover(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if env.Kernel != k || env.Initramfs != i || env.Firmware != "" || env.CHVersion != "v53.0" {
		t.Fatalf("got %+v", env)
	}
}

func TestDiscoverExplicitPathMissingIsNamed(t *testing.T) {
	isolate(t)
	dir := t.TempDir()
	ch := fakeCH(t, dir, "cloud-hypervisor v50.0")
	img := touch(t, dir, "img")
	// A well-known firmware exists, but the explicitly named one does not:
	// discovery must say so instead of booting the other one.
	wk := touch(t, dir, "hypervisor-fw")
	wellKnown = func() map[string][]string { return map[string][]string{"firmware": {wk}} }
	_, err := Discover(Options{CHBinary: ch, Image: img, Firmware: filepath.Join(dir, "nope.fd")})
	if !errors.Is(err, ErrMissing) || !strings.Contains(err.Error(), "nope.fd") {
		t.Fatalf("err %v: want the missing firmware named", err)
	}
	env, err := Discover(Options{CHBinary: ch, Image: img})
	if err != nil || env.Firmware != wk {
		t.Fatalf("well-known firmware: env %+v err %v", env, err)
	}
}

func TestDiscoverRefusesVersionsOutsideRange(t *testing.T) {
	isolate(t)
	dir := t.TempDir()
	img := touch(t, dir, "img")
	fw := touch(t, dir, "fw")
	cases := []struct {
		printed  string
		min, max string
		wantOK   bool
		wantText string
	}{
		{"cloud-hypervisor v40.0", "", "", true, ""},
		{"cloud-hypervisor v53.0\nMigration Protocol Versions: 1.0", "", "", true, ""},
		{"cloud-hypervisor v39.0", "", "", false, "cloud-hypervisor v39.0, outside the supported range v40..v53"},
		{"cloud-hypervisor v54.0", "", "", false, "v54.0, outside the supported range v40..v53"},
		{"cloud-hypervisor v45.0", "v46", "v53", false, "v45.0, outside the supported range v46..v53"},
		{"fake hypervisor build unknown", "", "", false, "cannot read a version"},
	}
	for _, tc := range cases {
		t.Run(tc.printed, func(t *testing.T) {
			ch := fakeCH(t, t.TempDir(), tc.printed)
			env, err := Discover(Options{CHBinary: ch, Firmware: fw, Image: img, MinVersion: tc.min, MaxVersion: tc.max})
			if tc.wantOK {
				if err != nil {
					t.Fatal(err)
				}
				if !strings.HasPrefix(env.CHVersion, "v") {
					t.Fatalf("version %q", env.CHVersion)
				}
				return
			}
			if !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), tc.wantText) || !strings.Contains(err.Error(), ch) {
				t.Fatalf("err %v: want ErrVersion naming %s and %q", err, ch, tc.wantText)
			}
			_, r, perr := Preflight(Options{CHBinary: ch, Firmware: fw, Image: img, MinVersion: tc.min, MaxVersion: tc.max})
			if perr == nil || r.Reason != ReasonVersion {
				t.Fatalf("preflight: %+v %v", r, perr)
			}
		})
	}
}

func TestParseVersion(t *testing.T) {
	cases := []struct {
		in     string
		tok    string
		v      Version
		wantOK bool
	}{
		{"cloud-hypervisor v53.0", "v53.0", Version{53, 0}, true},
		{"cloud-hypervisor v48.0-12-gabc-dirty\n", "v48.0-12-gabc-dirty", Version{48, 0}, true},
		{"cloud-hypervisor 41.1.2", "41.1.2", Version{41, 1}, true},
		{"v40", "v40", Version{40, 0}, true},
		{"cloud-hypervisor dev", "", Version{}, false},
		{"", "", Version{}, false},
		{"cloud-hypervisor 7", "", Version{}, false},
		{"built 1.2.3 from tree\ncloud-hypervisor v47.0", "v47.0", Version{47, 0}, true},
		{"note 1.2.3", "1.2.3", Version{1, 2}, true},
	}
	for _, tc := range cases {
		tok, v, err := ParseVersion(tc.in)
		if (err == nil) != tc.wantOK || tok != tc.tok || v != tc.v {
			t.Errorf("ParseVersion(%q) = %q %v %v; want %q %v ok=%v", tc.in, tok, v, err, tc.tok, tc.v, tc.wantOK)
		}
	}
}

// --version output comes from whatever binary is installed: outside input.
func FuzzParseVersion(f *testing.F) {
	for _, s := range []string{"cloud-hypervisor v53.0", "cloud-hypervisor v48.0-12-gabc-dirty\nMigration Protocol Versions: 1.0", "v40", "41.1.2", "", "v", "v.", "v-1", "v99999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, v, err := ParseVersion(s)
		if err != nil {
			return
		}
		if tok == "" || !strings.Contains(s, tok) || v.Major < 0 || v.Minor < 0 {
			t.Fatalf("ParseVersion(%q) = %q %v", s, tok, v)
		}
		// The token parses to the same version on its own.
		_, v2, err := ParseVersion(tok)
		if err != nil || v2 != v {
			t.Fatalf("token %q re-parses to %v %v", tok, v2, err)
		}
	})
}

func TestCheckVersionReadsStdoutOnly(t *testing.T) {
	p := filepath.Join(t.TempDir(), CHName)
	script := "#!/bin/sh\necho 'warning: libfoo 99.1 is old' >&2\necho 'cloud-hypervisor v52.0'\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	v, err := CheckVersion(p, "", "")
	if err != nil || v != "v52.0" {
		t.Fatalf("got %q %v; want v52.0 from stdout", v, err)
	}
	fail := filepath.Join(t.TempDir(), CHName)
	if err := os.WriteFile(fail, []byte("#!/bin/sh\necho 'cannot open /dev/kvm' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckVersion(fail, "", ""); err == nil || !strings.Contains(err.Error(), "cannot open /dev/kvm") {
		t.Fatalf("failing --version: %v; want its stderr in the error", err)
	}
}
