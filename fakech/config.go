package fakech

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/vmchaos/vmchaos/chapi"
)

// DefaultMemory is CH's default guest RAM (size=512M).
const DefaultMemory = 512 << 20

// splitOptions splits CH's "k=v,k=v" option list. Commas inside [...] or
// "..." do not split (fd=[3,4]), as in CH's OptionParser.
func splitOptions(s string) ([]string, error) {
	var out []string
	depth, quoted, start := 0, false, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			quoted = !quoted
		case '[':
			if !quoted {
				depth++
			}
		case ']':
			if !quoted {
				if depth == 0 {
					return nil, fmt.Errorf("unbalanced ']'")
				}
				depth--
			}
		case ',':
			if !quoted && depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	if quoted || depth != 0 {
		return nil, fmt.Errorf("unterminated quote or bracket")
	}
	return append(out, s[start:]), nil
}

// parseKV parses an option list against the keys the flag knows.
func parseKV(flag, s string, known ...string) (map[string]string, error) {
	parts, err := splitOptions(s)
	if err != nil {
		return nil, fmt.Errorf("error parsing --%s: %w", flag, err)
	}
	out := map[string]string{}
	for _, p := range parts {
		if p == "" {
			continue
		}
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("error parsing --%s: option %q has no value", flag, p)
		}
		if !contains(known, k) {
			return nil, fmt.Errorf("error parsing --%s: unknown option: %s", flag, k)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("error parsing --%s: option %s given twice", flag, k)
		}
		out[k] = strings.Trim(v, `"`)
	}
	return out, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// parseBool accepts CH's on/off/true/false.
func parseBool(flag, key, v string) (bool, error) {
	switch v {
	case "on", "true":
		return true, nil
	case "off", "false":
		return false, nil
	}
	return false, fmt.Errorf("error parsing --%s: %s=%q: want on|off|true|false", flag, key, v)
}

// parseSize parses a byte size with CH's binary K/M/G/T suffixes.
func parseSize(s string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, strings.TrimSuffix(s, "G")
	case strings.HasSuffix(s, "T"):
		mult, s = 1<<40, strings.TrimSuffix(s, "T")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<50)/mult {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	return n * mult, nil
}

var (
	diskKeys = []string{"path", "readonly", "direct", "iommu", "num_queues", "queue_size", "vhost_user", "socket",
		"id", "image_type", "serial", "rate_limit_group", "bw_size", "bw_one_time_burst", "bw_refill_time",
		"ops_size", "ops_one_time_burst", "ops_refill_time", "pci_segment", "sparse", "queue_affinity", "backing_files"}
	netKeys = []string{"tap", "ip", "mask", "mac", "host_mac", "mtu", "iommu", "num_queues", "queue_size", "id",
		"vhost_user", "socket", "vhost_mode", "fd", "bw_size", "bw_one_time_burst", "bw_refill_time", "ops_size",
		"ops_one_time_burst", "ops_refill_time", "pci_segment", "offload_tso", "offload_ufo", "offload_csum"}
	cpusKeys       = []string{"boot", "max", "topology", "kvm_hyperv", "max_phys_bits", "affinity", "features", "nested"}
	memoryKeys     = []string{"size", "mergeable", "shared", "hugepages", "hugepage_size", "hotplug_method", "hotplug_size", "hotplugged_size", "prefault", "thp"}
	restoreKeys    = []string{"source_url", "prefault", "net_fds", "resume", "memory_restore_mode"}
	restoreKeysV51 = []string{"source_url", "prefault", "net_fds"} // resume, memory_restore_mode: v52+
)

// ParseDisk parses one --disk value.
func ParseDisk(s string) (chapi.DiskConfig, error) {
	kv, err := parseKV("disk", s, diskKeys...)
	if err != nil {
		return chapi.DiskConfig{}, err
	}
	d := chapi.DiskConfig{Path: kv["path"], ID: kv["id"], ImageType: kv["image_type"]}
	if v, ok := kv["readonly"]; ok {
		if d.Readonly, err = parseBool("disk", "readonly", v); err != nil {
			return d, err
		}
	}
	if d.Path == "" && kv["vhost_user"] == "" {
		return d, fmt.Errorf("error parsing --disk: missing path")
	}
	return d, nil
}

// ParseNet parses one --net value.
func ParseNet(s string) (chapi.NetConfig, error) {
	kv, err := parseKV("net", s, netKeys...)
	if err != nil {
		return chapi.NetConfig{}, err
	}
	n := chapi.NetConfig{Tap: kv["tap"], IP: kv["ip"], Mask: kv["mask"], Mac: kv["mac"], HostMac: kv["host_mac"], ID: kv["id"]}
	for key, dst := range map[string]*int{"mtu": &n.Mtu, "num_queues": &n.NumQueues, "queue_size": &n.QueueSize} {
		if v, ok := kv[key]; ok {
			x, err := strconv.Atoi(v)
			if err != nil || x < 0 {
				return n, fmt.Errorf("error parsing --net: %s=%q: want a number", key, v)
			}
			*dst = x
		}
	}
	if n.IP != "" {
		if _, err := netip.ParseAddr(n.IP); err != nil {
			return n, fmt.Errorf("error parsing --net: ip=%q: %w", n.IP, err)
		}
	}
	return n, nil
}

// parseConsole parses --serial/--console: off|null|pty|tty|file=P|socket=P.
func parseConsole(flag, s string) (*chapi.ConsoleConfig, error) {
	switch s {
	case "off":
		return &chapi.ConsoleConfig{Mode: "Off"}, nil
	case "null":
		return &chapi.ConsoleConfig{Mode: "Null"}, nil
	case "pty":
		return &chapi.ConsoleConfig{Mode: "Pty"}, nil
	case "tty":
		return &chapi.ConsoleConfig{Mode: "Tty"}, nil
	}
	if p, ok := strings.CutPrefix(s, "file="); ok && p != "" {
		return &chapi.ConsoleConfig{Mode: "File", File: p}, nil
	}
	if p, ok := strings.CutPrefix(s, "socket="); ok && p != "" && flag == "serial" {
		return &chapi.ConsoleConfig{Mode: "Socket", Socket: p}, nil
	}
	return nil, fmt.Errorf("error parsing --%s: invalid value %q", flag, s)
}

// BuildConfig turns the CLI into the VmConfig CH would create and boot. Errors
// here exit 1 (CH parses the config only after binding the API socket).
func BuildConfig(o *Options) (*chapi.VmConfig, error) {
	cfg := &chapi.VmConfig{Payload: &chapi.PayloadConfig{Kernel: o.Kernel, Firmware: o.Firmware, Cmdline: o.Cmdline, Initramfs: o.Initramfs}}
	if o.Cpus != "" {
		kv, err := parseKV("cpus", o.Cpus, cpusKeys...)
		if err != nil {
			return nil, err
		}
		c := &chapi.CpusConfig{BootVcpus: 1}
		if v, ok := kv["boot"]; ok {
			if c.BootVcpus, err = strconv.Atoi(v); err != nil || c.BootVcpus < 1 || c.BootVcpus > 255 {
				return nil, fmt.Errorf("error parsing --cpus: boot=%q", v)
			}
		}
		c.MaxVcpus = c.BootVcpus
		if v, ok := kv["max"]; ok {
			if c.MaxVcpus, err = strconv.Atoi(v); err != nil || c.MaxVcpus < c.BootVcpus || c.MaxVcpus > 255 {
				return nil, fmt.Errorf("error parsing --cpus: max=%q", v)
			}
		}
		cfg.Cpus = c
	}
	if o.Memory != "" {
		kv, err := parseKV("memory", o.Memory, memoryKeys...)
		if err != nil {
			return nil, err
		}
		m := &chapi.MemoryConfig{Size: DefaultMemory}
		if v, ok := kv["size"]; ok {
			if m.Size, err = parseSize(v); err != nil {
				return nil, fmt.Errorf("error parsing --memory: %w", err)
			}
		}
		for key, dst := range map[string]*bool{"shared": &m.Shared, "hugepages": &m.Hugepages} {
			if v, ok := kv[key]; ok {
				if *dst, err = parseBool("memory", key, v); err != nil {
					return nil, err
				}
			}
		}
		cfg.Memory = m
	}
	for _, s := range o.Disks {
		d, err := ParseDisk(s)
		if err != nil {
			return nil, err
		}
		cfg.Disks = append(cfg.Disks, d)
	}
	for _, s := range o.Nets {
		n, err := ParseNet(s)
		if err != nil {
			return nil, err
		}
		cfg.Net = append(cfg.Net, n)
	}
	var err error
	if o.Serial != "" {
		if cfg.Serial, err = parseConsole("serial", o.Serial); err != nil {
			return nil, err
		}
	}
	if o.Console != "" {
		if cfg.Console, err = parseConsole("console", o.Console); err != nil {
			return nil, err
		}
	}
	fillDefaults(cfg)
	return cfg, nil
}

// fillDefaults sets what CH reports for omitted fields in vm.info.
func fillDefaults(cfg *chapi.VmConfig) {
	if cfg.Cpus == nil {
		cfg.Cpus = &chapi.CpusConfig{BootVcpus: 1, MaxVcpus: 1}
	}
	if cfg.Memory == nil {
		cfg.Memory = &chapi.MemoryConfig{Size: DefaultMemory}
	}
	if cfg.Serial == nil {
		cfg.Serial = &chapi.ConsoleConfig{Mode: "Null"}
	}
	if cfg.Console == nil {
		cfg.Console = &chapi.ConsoleConfig{Mode: "Tty"}
	}
	for i := range cfg.Net {
		if cfg.Net[i].NumQueues == 0 {
			cfg.Net[i].NumQueues = 2
		}
		if cfg.Net[i].QueueSize == 0 {
			cfg.Net[i].QueueSize = 256
		}
	}
	for i := range cfg.Disks {
		if cfg.Disks[i].ImageType == "" {
			cfg.Disks[i].ImageType = "Raw"
		}
	}
}

// ParseRestore parses --restore source_url=file:///dir[,resume=on][,prefault=on][,memory_restore_mode=copy].
func ParseRestore(s string) (chapi.RestoreConfig, error) { return ParseRestoreFor(CompatV53, s) }

// ParseRestoreFor parses --restore with the keys compat's CH knows: v51's
// option parser refuses resume= and memory_restore_mode= ("unknown option").
func ParseRestoreFor(compat Compat, s string) (chapi.RestoreConfig, error) {
	keys := restoreKeys
	if compat == CompatV51 {
		keys = restoreKeysV51
	}
	kv, err := parseKV("restore", s, keys...)
	if err != nil {
		return chapi.RestoreConfig{}, err
	}
	r := chapi.RestoreConfig{SourceURL: kv["source_url"]}
	if r.SourceURL == "" {
		return r, fmt.Errorf("error parsing --restore: missing source_url")
	}
	for key, dst := range map[string]*bool{"resume": &r.Resume, "prefault": &r.Prefault} {
		if v, ok := kv[key]; ok {
			if *dst, err = parseBool("restore", key, v); err != nil {
				return r, err
			}
		}
	}
	if v, ok := kv["memory_restore_mode"]; ok {
		switch strings.ToLower(v) {
		case "copy":
			r.MemoryRestoreMode = "Copy"
		case "ondemand":
			r.MemoryRestoreMode = "OnDemand"
		default:
			return r, fmt.Errorf("error parsing --restore: memory_restore_mode=%q", v)
		}
	}
	return r, nil
}

// APISocketSpec is a parsed --api-socket: a path, or an inherited fd.
type APISocketSpec struct {
	Path string
	FD   int // -1 when Path is used
}

// ParseAPISocket parses path=<p>, fd=<n> or a bare <p>.
func ParseAPISocket(s string) (APISocketSpec, error) {
	if !strings.Contains(s, "=") {
		if s == "" {
			return APISocketSpec{}, fmt.Errorf("error parsing --api-socket: empty path")
		}
		return APISocketSpec{Path: s, FD: -1}, nil
	}
	kv, err := parseKV("api-socket", s, "path", "fd")
	if err != nil {
		return APISocketSpec{}, err
	}
	p, hasP := kv["path"]
	f, hasF := kv["fd"]
	switch {
	case hasP && hasF:
		return APISocketSpec{}, fmt.Errorf("error parsing --api-socket: path and fd are exclusive")
	case hasP && p != "":
		return APISocketSpec{Path: p, FD: -1}, nil
	case hasF:
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return APISocketSpec{}, fmt.Errorf("error parsing --api-socket: fd=%q", f)
		}
		return APISocketSpec{FD: n}, nil
	}
	return APISocketSpec{}, fmt.Errorf("error parsing --api-socket: need path= or fd=")
}
