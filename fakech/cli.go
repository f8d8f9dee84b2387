package fakech

import (
	"fmt"
	"sort"
	"strings"
)

// Options is the command line as cloud-hypervisor's clap parser accepts it.
// Values stay raw strings here: CH parses them (and fails with exit 1) only
// after the API socket is bound, see BuildConfig.
type Options struct {
	Help      bool
	Version   bool
	Verbosity int

	APISocket    string
	Kernel       string
	Firmware     string
	Cmdline      string
	Initramfs    string
	Cpus         string
	Memory       string
	Disks        []string
	Nets         []string
	Serial       string
	Console      string
	Restore      string
	LogFile      string
	EventMonitor string
	NoShutdown   bool

	// Given holds every long flag that appeared (without dashes), so that
	// repeats and the payload requirement can be checked.
	Given map[string]bool
	// Other keeps flags that fakech accepts for compatibility but does not
	// model (--rng, --balloon, ...): name → values.
	Other map[string][]string
}

type flagKind int

const (
	kindValue flagKind = iota // exactly one value, may appear once
	kindMulti                 // one or more values after one flag; the flag may repeat
	kindBool                  // no value
)

type flagDef struct {
	kind flagKind
	// vmConfig flags describe the VM; clap makes them require a payload
	// (--kernel or --firmware; --igvm exists only in builds with the igvm
	// feature, which the default build lacks: conformance TestRowHelpFlags).
	vmConfig bool
	help     string
}

// flags is CH v51's long-flag table (the subset managers use plus the rest
// accepted and ignored, so a real manager's command line is never refused).
var flags = map[string]flagDef{
	"api-socket":         {kindValue, false, "HTTP API socket (UNIX domain socket): path=</path/to/a/file> | fd=<fd>"},
	"event-monitor":      {kindValue, false, "File to report events on: path=</path/to/a/file> | fd=<fd>"},
	"log-file":           {kindValue, false, "Log file. Standard error is used if not specified"},
	"restore":            {kindValue, false, "Restore from a VM snapshot: source_url=<source_url>,prefault=on|off,resume=on|off"},
	"seccomp":            {kindValue, false, "Seccomp configuration: true|false|log"},
	"kernel":             {kindValue, false, "Path to kernel to load. This may be a kernel or firmware that supports a PVH entry point"},
	"firmware":           {kindValue, false, "Path to firmware that is loaded in an architectural specific way"},
	"cmdline":            {kindValue, true, "Kernel command line"},
	"initramfs":          {kindValue, true, "Path to initramfs image"},
	"cpus":               {kindValue, true, "boot=<boot_vcpus>,max=<max_vcpus>,... (default: boot=1,max_phys_bits=46)"},
	"platform":           {kindValue, true, "num_pci_segments=<num_pci_segments>,..."},
	"memory":             {kindValue, true, "Memory parameters: size=<guest_memory_size>,shared=on|off,hugepages=on|off,... (default: size=512M)"},
	"rng":                {kindValue, true, "Random number generator parameters: src=<entropy_source_path> (default: src=/dev/urandom)"},
	"balloon":            {kindValue, true, "Balloon parameters: size=<balloon_size>,..."},
	"serial":             {kindValue, true, "Control serial port: off|null|pty|tty|file=</path/to/a/file>|socket=</path/to/a/file> (default: null)"},
	"console":            {kindValue, true, "Control (virtio) console: off|null|pty|tty|file=</path/to/a/file> (default: tty)"},
	"debug-console":      {kindValue, true, "Debug console: off|pty|tty|file=</path/to/a/file>,iobase=<port in hex>"},
	"vsock":              {kindValue, true, "Virtio VSOCK parameters: cid=<context_id>,socket=<socket_path>,..."},
	"tpm":                {kindValue, true, "TPM device: socket=</path/to/a/socket>"},
	"pvpanic":            {kindBool, true, "Enable pvpanic device"},
	"watchdog":           {kindBool, true, "Enable virtio-watchdog"},
	"landlock":           {kindBool, true, "Enable Landlock sandboxing"},
	"disk":               {kindMulti, true, "Disk parameters: path=<disk_image_path>,readonly=on|off,id=<device_id>,... (the FIRST disk is the fake guest image)"},
	"net":                {kindMulti, true, "Network parameters: tap=<if_name>,ip=<ip_addr>,mask=<net_mask>,mac=<mac_addr>,id=<device_id>,... (ip= must be in 127.0.0.0/8: the fake guest's SSH server listens there)"},
	"memory-zone":        {kindMulti, true, "User defined memory zone parameters"},
	"rate-limit-group":   {kindMulti, true, "Rate limit group parameters"},
	"fs":                 {kindMulti, true, "virtio-fs parameters"},
	"pmem":               {kindMulti, true, "Persistent memory parameters"},
	"device":             {kindMulti, true, "Direct device assignment parameters"},
	"user-device":        {kindMulti, true, "vfio-user device parameters"},
	"vdpa":               {kindMulti, true, "vDPA device parameters"},
	"numa":               {kindMulti, true, "Settings related to a given NUMA node"},
	"pci-segment":        {kindMulti, true, "PCI segment parameters"},
	"landlock-rules":     {kindMulti, true, "Landlock rules"},
	"no-shutdown":        {kindBool, false, "Do not exit the VMM when the guest powers off (the VM goes back to Created)"},
	"log-format":         {kindValue, false, "Log format (v52+)"},
	"generic-vhost-user": {kindMulti, true, "generic vhost-user device parameters (v52+)"},
	"rtc":                {kindValue, true, "RTC parameters (v53+)"},
	"version":            {kindBool, false, "Print version"},
	"help":               {kindBool, false, "Print help"},
}

// UsageError is a command line clap refuses: exit status 2.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

func usageErr(format string, a ...any) error {
	return &UsageError{Msg: "error: " + fmt.Sprintf(format, a...) + "\n\nUsage: cloud-hypervisor [OPTIONS]\n\nFor more information, try '--help'."}
}

// ParseArgs parses argv (without the program name) with clap's rules: no
// arguments is a usage error (help, exit 2), unknown flags and positional
// arguments are refused, single-value flags may not repeat, and any VM-config
// flag requires --kernel or --firmware.
func ParseArgs(args []string) (*Options, error) { return ParseArgsFor(CompatV53, args) }

// flagSince is the first CH release whose default build (features io_uring
// and kvm) defines a flag; flags not listed exist in v51 already
// (cloud-hypervisor/src/main.rs of v51.0, v52.0, v53.0).
var flagSince = map[string]Compat{
	"no-shutdown":        CompatV52,
	"log-format":         CompatV52,
	"generic-vhost-user": CompatV52,
	"rtc":                CompatV53,
}

func (c Compat) atLeast(o Compat) bool { return c >= o } // "v51" < "v52" < "v53"

// ParseArgsFor parses args with the flags compat's CH defines: clap refuses
// a flag the release does not know, like any unknown flag (exit 2).
func ParseArgsFor(compat Compat, args []string) (*Options, error) {
	if len(args) == 0 {
		return nil, &UsageError{Msg: HelpText()}
	}
	o := &Options{Given: map[string]bool{}, Other: map[string][]string{}}
	for i := 0; i < len(args); i++ {
		a := args[i]
		var err error
		switch {
		case a == "--":
			if i+1 < len(args) {
				return nil, usageErr("unexpected argument '%s' found", args[i+1])
			}
			continue
		case strings.HasPrefix(a, "--"):
			i, err = o.parseLong(compat, args, i)
		case strings.HasPrefix(a, "-") && len(a) > 1:
			err = o.parseShort(a)
		default:
			err = usageErr("unexpected argument '%s' found", a)
		}
		if err != nil {
			return nil, err
		}
	}
	if o.Help || o.Version {
		return o, nil
	}
	if err := o.checkBootSource(); err != nil {
		return nil, err
	}
	return o, nil
}

// parseLong parses the long flag args[i] and the values it takes; it
// returns the index of the last argument it consumed.
func (o *Options) parseLong(compat Compat, args []string, i int) (int, error) {
	name, val, hasEq := strings.Cut(args[i][2:], "=")
	def, ok := flags[name]
	if since, gated := flagSince[name]; gated && !compat.atLeast(since) {
		ok = false
	}
	if !ok {
		return i, usageErr("unexpected argument '--%s' found", name)
	}
	if def.kind != kindMulti && o.Given[name] {
		return i, usageErr("the argument '--%s <%s>' cannot be used multiple times", name, name)
	}
	o.Given[name] = true
	switch def.kind {
	case kindBool:
		if hasEq {
			return i, usageErr("unexpected value '%s' for '--%s' found; no more were expected", val, name)
		}
		o.setBool(name)
	case kindValue:
		if !hasEq {
			if i+1 >= len(args) || isFlagLike(args[i+1]) {
				return i, usageErr("a value is required for '--%s <%s>' but none was supplied", name, name)
			}
			i++
			val = args[i]
		}
		o.setValue(name, val)
	case kindMulti:
		var vals []string
		if hasEq {
			vals = append(vals, val)
		}
		for i+1 < len(args) && !isFlagLike(args[i+1]) {
			i++
			vals = append(vals, args[i])
		}
		if len(vals) == 0 {
			return i, usageErr("a value is required for '--%s <%s>' but none was supplied", name, name)
		}
		o.addValues(name, vals)
	}
	return i, nil
}

// parseShort parses a cluster of short flags such as -vv.
func (o *Options) parseShort(a string) error {
	for _, c := range a[1:] {
		switch c {
		case 'v':
			o.Verbosity++
		case 'V':
			o.Version = true
		case 'h':
			o.Help = true
		default:
			return usageErr("unexpected argument '-%c' found", c)
		}
	}
	return nil
}

// checkBootSource refuses VM-config flags without --kernel or --firmware,
// as clap's required group does.
func (o *Options) checkBootSource() error {
	if o.Kernel != "" || o.Firmware != "" {
		return nil
	}
	var cfg []string
	for name := range o.Given {
		if flags[name].vmConfig {
			cfg = append(cfg, "--"+name)
		}
	}
	if len(cfg) > 0 {
		sort.Strings(cfg)
		return usageErr("the following required arguments were not provided:\n  <--firmware <firmware>|--kernel <kernel>>\n(needed by %s)", strings.Join(cfg, ", "))
	}
	return nil
}

// isFlagLike reports whether clap would read s as the next flag rather than a
// value (values starting with '-' are not allowed by CH's flags).
func isFlagLike(s string) bool { return strings.HasPrefix(s, "-") && len(s) > 1 }

func (o *Options) setBool(name string) {
	switch name {
	case "no-shutdown":
		o.NoShutdown = true
	case "version":
		o.Version = true
	case "help":
		o.Help = true
	default:
		o.Other[name] = []string{"on"}
	}
}

func (o *Options) setValue(name, val string) {
	switch name {
	case "api-socket":
		o.APISocket = val
	case "kernel":
		o.Kernel = val
	case "firmware":
		o.Firmware = val
	case "cmdline":
		o.Cmdline = val
	case "initramfs":
		o.Initramfs = val
	case "cpus":
		o.Cpus = val
	case "memory":
		o.Memory = val
	case "serial":
		o.Serial = val
	case "console":
		o.Console = val
	case "restore":
		o.Restore = val
	case "log-file":
		o.LogFile = val
	case "event-monitor":
		o.EventMonitor = val
	default:
		o.Other[name] = []string{val}
	}
}

func (o *Options) addValues(name string, vals []string) {
	switch name {
	case "disk":
		o.Disks = append(o.Disks, vals...)
	case "net":
		o.Nets = append(o.Nets, vals...)
	default:
		o.Other[name] = append(o.Other[name], vals...)
	}
}

// Boots reports whether the command line describes a VM to create and boot.
func (o *Options) Boots() bool { return o.Kernel != "" || o.Firmware != "" }

// HelpText is what -h prints (and, on stderr, what no arguments prints).
func HelpText() string {
	var b strings.Builder
	b.WriteString("Launch a cloud-hypervisor VMM (fakech: the vmchaos fake; the payload is not run, the first --disk is a fake guest image).\n\n")
	b.WriteString("Usage: cloud-hypervisor [OPTIONS]\n\nOptions:\n")
	names := make([]string, 0, len(flags))
	for n := range flags {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		d := flags[n]
		arg := " <" + n + ">"
		if d.kind == kindBool {
			arg = ""
		} else if d.kind == kindMulti {
			arg = " <" + n + ">..."
		}
		fmt.Fprintf(&b, "      --%s%s\n          %s\n", n, arg, d.help)
	}
	b.WriteString("  -v...\n          Sets the level of debugging output\n")
	b.WriteString("  -V\n          Print version\n  -h\n          Print help\n")
	b.WriteString("\nfakech environment: FAKECH_COMPAT=v51|v53 (default v51), FAKECH_TIMING='{\"boot\":\"1s\",...}',\n")
	b.WriteString("FAKECH_JITTER_SEED=<n>, VMCHAOS_TIME_SCALE=<f>, VMCHAOS_TRACE, VMCHAOS_FAILPOINTS, VMCHAOS_FAILPOINT_CTL.\n")
	return b.String()
}
