package fakech

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestParseArgsFollowsClapRules(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		usage   string // substring of the usage error; "" means accepted
		check   func(*Options) bool
		comment string
	}{
		{name: "api-only", args: []string{"--api-socket", "path=/r/api.sock"}, check: func(o *Options) bool { return o.APISocket == "path=/r/api.sock" && !o.Boots() }},
		{name: "equals form", args: []string{"--api-socket=/r/api.sock", "-vv"}, check: func(o *Options) bool { return o.APISocket == "/r/api.sock" && o.Verbosity == 2 }},
		{name: "several disks after one flag", args: []string{"--kernel", "k", "--disk", "path=a", "path=b", "--disk", "path=c"}, check: func(o *Options) bool { return len(o.Disks) == 3 }},
		{name: "no args", args: nil, usage: "Usage: cloud-hypervisor"},
		{name: "unknown long flag", args: []string{"--nope"}, usage: "unexpected argument '--nope'"},
		{name: "unknown short flag", args: []string{"-x"}, usage: "unexpected argument '-x'"},
		{name: "positional", args: []string{"--kernel", "k", "extra", "more"}, usage: "unexpected argument 'extra'"},
		{name: "after --", args: []string{"--", "x"}, usage: "unexpected argument 'x'"},
		{name: "repeat of a single flag", args: []string{"--kernel", "a", "--kernel", "b"}, usage: "cannot be used multiple times"},
		{name: "missing value at end", args: []string{"--log-file"}, usage: "a value is required"},
		{name: "flag as value", args: []string{"--api-socket", "--kernel", "k"}, usage: "a value is required"},
		{name: "bool with value", args: []string{"--no-shutdown=yes"}, usage: "unexpected value"},
		{name: "net without payload", args: []string{"--api-socket", "/s", "--net", "ip=127.0.0.2"}, usage: "required arguments were not provided"},
		{name: "serial without payload", args: []string{"--serial", "off"}, usage: "required arguments were not provided"},
		{name: "restore is not VM config", args: []string{"--api-socket", "/s", "--restore", "source_url=file:///x"}, check: func(o *Options) bool { return o.Restore != "" }},
		{name: "firmware satisfies payload", args: []string{"--firmware", "fw", "--cpus", "boot=2", "--memory", "size=1G", "--console", "off", "--serial", "file=/tmp/s"}, check: func(o *Options) bool { return o.Boots() }},
		{name: "version", args: []string{"-V"}, check: func(o *Options) bool { return o.Version }},
		{name: "help wins over payload check", args: []string{"--disk", "path=x", "--help"}, check: func(o *Options) bool { return o.Help }},
		{name: "accepted but unmodelled", args: []string{"--kernel", "k", "--rng", "src=/dev/urandom", "--seccomp", "false"}, check: func(o *Options) bool { return o.Other["rng"][0] == "src=/dev/urandom" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := ParseArgs(tc.args)
			if tc.usage != "" {
				var ue *UsageError
				if !errors.As(err, &ue) || !strings.Contains(ue.Msg, tc.usage) {
					t.Fatalf("want usage error with %q, got %v", tc.usage, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(o) {
				t.Fatalf("options %+v", o)
			}
		})
	}
}

func TestBuildConfig(t *testing.T) {
	o, err := ParseArgs([]string{"--kernel", "/k", "--cmdline", "console=hvc0", "--cpus", "boot=2,max=4", "--memory", "size=4G,shared=on",
		"--disk", "path=/img,readonly=off,id=root", "path=/data,image_type=qcow2", "--net", "tap=tap0,ip=127.0.0.9,mac=52:54:00:00:00:01", "--serial", "file=/tmp/s", "--console", "off"})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := BuildConfig(o)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Cpus.BootVcpus != 2 || cfg.Cpus.MaxVcpus != 4 || cfg.Memory.Size != 4<<30 || !cfg.Memory.Shared {
		t.Fatalf("cpus/memory %+v %+v", cfg.Cpus, cfg.Memory)
	}
	if len(cfg.Disks) != 2 || cfg.Disks[0].ID != "root" || cfg.Disks[1].ImageType != "qcow2" || cfg.Disks[0].ImageType != "Raw" {
		t.Fatalf("disks %+v", cfg.Disks)
	}
	if cfg.Net[0].IP != "127.0.0.9" || cfg.Net[0].Tap != "tap0" || cfg.Net[0].NumQueues != 2 || cfg.Net[0].QueueSize != 256 {
		t.Fatalf("net %+v", cfg.Net)
	}
	if cfg.Serial.Mode != "File" || cfg.Serial.File != "/tmp/s" || cfg.Console.Mode != "Off" || cfg.Payload.Cmdline != "console=hvc0" {
		t.Fatalf("serial/console/payload %+v %+v %+v", cfg.Serial, cfg.Console, cfg.Payload)
	}
	for _, bad := range [][]string{
		{"--kernel", "k", "--memory", "size=12Q"},
		{"--kernel", "k", "--disk", "path=/x,bogus=1"},
		{"--kernel", "k", "--disk", "readonly=on"},
		{"--kernel", "k", "--net", "ip=not-an-ip"},
		{"--kernel", "k", "--cpus", "boot=0"},
		{"--kernel", "k", "--serial", "sideways"},
		{"--kernel", "k", "--disk", "path=\"/x"},
	} {
		o, err := ParseArgs(bad)
		if err != nil {
			t.Fatalf("%v: %v", bad, err)
		}
		if _, err := BuildConfig(o); err == nil {
			t.Errorf("%v: accepted", bad)
		}
	}
}

func TestParseAPISocketAndRestore(t *testing.T) {
	for in, want := range map[string]APISocketSpec{"/a.sock": {Path: "/a.sock", FD: -1}, "path=/b": {Path: "/b", FD: -1}, "fd=3": {FD: 3}} {
		got, err := ParseAPISocket(in)
		if err != nil || got != want {
			t.Errorf("%q: %+v %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "path=", "fd=-1", "path=/a,fd=3", "foo=bar"} {
		if _, err := ParseAPISocket(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	r, err := ParseRestore("source_url=file:///s,resume=on,prefault=false,memory_restore_mode=ondemand")
	if err != nil || r.SourceURL != "file:///s" || !r.Resume || r.Prefault || r.MemoryRestoreMode != "OnDemand" {
		t.Fatalf("%+v %v", r, err)
	}
	if _, err := ParseRestore("resume=on"); err == nil {
		t.Fatal("restore without source_url accepted")
	}
}

func TestParseTiming(t *testing.T) {
	tm, err := ParseTiming(`{"boot":"2s","snapshot_per_gib":250,"jitter":0.5}`)
	if err != nil {
		t.Fatal(err)
	}
	if tm.Boot != Duration(2e9) || tm.SnapshotPerGiB != Duration(250e6) || tm.Jitter != 0.5 || tm.Pause != DefaultTiming.Pause {
		t.Fatalf("%+v", tm)
	}
	for _, bad := range []string{`{"bot":"1s"}`, `{"boot":"-1s"}`, `{"boot":-5}`, `{"jitter":2}`, `[]`, `{} {}`} {
		if _, err := ParseTiming(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestJitterIsSeededAndBounded(t *testing.T) {
	tm := DefaultTiming
	a, _ := newClock(tm, 1, "42")
	b, _ := newClock(tm, 1, "42")
	varied := false
	for range 50 {
		x, y := a.d(tm.Boot), b.d(tm.Boot)
		if x != y {
			t.Fatalf("same seed, different durations %v %v", x, y)
		}
		if x < 800e6 || x > 1200e6 {
			t.Fatalf("jittered boot %v outside ±20%%", x)
		}
		varied = varied || x != 1e9
	}
	if !varied {
		t.Fatal("jitter never changed a duration")
	}
	plain, _ := newClock(tm, 0.5, "")
	if plain.d(tm.Boot) != 500e6 {
		t.Fatalf("no seed: %v, want exactly scaled", plain.d(tm.Boot))
	}
}

func TestDecodeCall(t *testing.T) {
	for _, tc := range []struct {
		req    string
		status int // 0: decoded
		ep     string
	}{
		{"GET /api/v1/vmm.ping HTTP/1.1\r\n\r\n", 0, "vmm.ping"},
		{"PUT /api/v1/vm.snapshot HTTP/1.1\r\nContent-Length: 36\r\n\r\n{\"destination_url\":\"file:///tmp/x\"}\n", 0, "vm.snapshot"},
		{"PUT /api/v1/vm.snapshot HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 400, ""},
		{"PUT /api/v1/vm.add-net HTTP/1.1\r\nContent-Length: 12\r\n\r\n{\"ip\":false}", 400, ""},
		{"PUT /api/v1/vm.pause HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 400, ""},
		{"PUT /api/v1/vm.info HTTP/1.1\r\n\r\n", 400, ""},
		{"GET /api/v2/vm.info HTTP/1.1\r\n\r\n", 404, ""},
	} {
		rr, bad, err := readRequest(bufio.NewReader(strings.NewReader(tc.req)), io.Discard)
		if err != nil || bad != nil {
			t.Fatalf("%q: transport %v %v", tc.req, bad, err)
		}
		c, resp := decodeCall(rr)
		if tc.status == 0 {
			if resp != nil || c.ep != tc.ep {
				t.Errorf("%q: %+v %+v", tc.req, c, resp)
			}
			continue
		}
		if resp == nil || resp.status != tc.status {
			t.Errorf("%q: want %d, got %+v", tc.req, tc.status, resp)
		}
	}
	var w bytes.Buffer
	_ = writeResponse(&w, respNoContent)
	if w.String() != "HTTP/1.1 204 \r\nServer: Cloud Hypervisor API\r\nConnection: keep-alive\r\nContent-Type: application/json\r\n\r\n" {
		t.Fatalf("204 wire form %q", w.String())
	}
}

// FuzzParseArgs: no command line panics; whatever parses builds a config or
// returns an error.
func FuzzParseArgs(f *testing.F) {
	for _, s := range []string{
		"--api-socket\x00path=/run/x/api.sock",
		"--kernel\x00/k\x00--disk\x00path=/a,id=x\x00path=/b\x00--net\x00tap=,ip=127.0.0.2,mask=255.0.0.0\x00-vvv",
		"--firmware=/fw\x00--cpus\x00boot=2,max=4\x00--memory\x00size=4G,shared=on\x00--serial\x00file=/s\x00--console\x00off",
		"--api-socket\x00/s\x00--restore\x00source_url=file:///snap,resume=on,memory_restore_mode=ondemand",
		"--disk\x00path=x",
		"--net\x00fd=[3,4],mac=\"a,b\"",
		"-Vh",
		"--\x00x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		args := strings.Split(s, "\x00")
		o, err := ParseArgs(args)
		if err != nil {
			var ue *UsageError
			if !errors.As(err, &ue) {
				t.Fatalf("non-usage error %T %v", err, err)
			}
			return
		}
		if o.Boots() {
			_, _ = BuildConfig(o)
		}
		if o.Restore != "" {
			_, _ = ParseRestore(o.Restore)
		}
		if o.APISocket != "" {
			_, _ = ParseAPISocket(o.APISocket)
		}
	})
}

// FuzzDecodeRequest: any bytes on the API socket give a decoded call, a CH
// error response, or a transport refusal — never a panic.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		"GET /api/v1/vmm.ping HTTP/1.1\r\nHost: localhost\r\n\r\n",
		"PUT /api/v1/vm.create HTTP/1.1\r\nContent-Length: 60\r\n\r\n{\"payload\":{\"firmware\":\"/fw\"},\"disks\":[{\"path\":\"/img\"}]}\n\n",
		"PUT /api/v1/vm.restore HTTP/1.1\r\nContent-Length: 30\r\n\r\n{\"source_url\":\"file:///snap\"}\n",
		"PUT /api/v1/vm.add-net HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"ip\"\r\n0\r\n\r\n",
		"PUT /api/v1/vm.remove-device HTTP/1.1\r\nContent-Length: 12\r\n\r\n{\"id\":\"_net1\"}",
		"PUT /api/v1/vm.pause HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n",
		"BREW /x HTCPCP/1.0\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		br := bufio.NewReader(bytes.NewReader(b))
		for range 4 {
			rr, bad, err := readRequest(br, io.Discard)
			if err != nil || bad != nil {
				if bad != nil && (bad.status != 400 || !bad.close) {
					t.Fatalf("transport refusal %+v", bad)
				}
				return
			}
			c, resp := decodeCall(rr)
			if (c == nil) == (resp == nil) {
				t.Fatalf("decodeCall must return exactly one of call/response: %+v %+v", c, resp)
			}
			if resp != nil {
				var w bytes.Buffer
				if err := writeResponse(&w, resp); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}
