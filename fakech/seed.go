package fakech

import (
	"encoding/binary"
	"encoding/json"
	"net"
	"os"
	"regexp"
	"strings"
	"unicode/utf16"

	"github.com/vmchaos/vmchaos/chapi"
)

// seed is what the fake guest learns from a cloud-init NoCloud seed among
// its disks (a FAT volume labelled CIDATA, as cidata.BuildCIData writes it),
// read the way cloud-init would: its instance, host name, SSH keys and the
// static address network-config gives each MAC. Only the shapes cidata
// writes are understood (values as YAML double-quoted scalars).
type seed struct {
	found          bool
	instanceID     string
	hostname       string
	authorizedKeys []string
	hostKey        []byte            // ed25519 host key PEM (ssh_keys: ed25519_private)
	addrs          map[string]string // MAC → static address
}

// maxSeed bounds what is read of a disk looking for a seed; a seed is a
// 1 MiB volume.
const maxSeed = 16 << 20

// readSeed finds the seed among cfg's disks after the first (the boot disk
// is never the seed). Disks that are not such a seed are skipped.
func readSeed(cfg *chapi.VmConfig) seed {
	sd := seed{addrs: map[string]string{}}
	for i, d := range cfg.Disks {
		if i == 0 {
			continue
		}
		fi, err := os.Stat(d.Path)
		if err != nil || fi.Size() > maxSeed {
			continue
		}
		b, err := os.ReadFile(d.Path)
		if err != nil {
			continue
		}
		md, ok := fatFile(b, "meta-data")
		if !ok {
			continue
		}
		sd.found = true
		sd.instanceID = yamlField(md, "instance-id")
		if ud, ok := fatFile(b, "user-data"); ok {
			sd.parseUserData(ud)
		}
		if nc, ok := fatFile(b, "network-config"); ok {
			for mac, ip := range parseNetworkConfig(nc) {
				sd.addrs[mac] = ip
			}
		}
	}
	return sd
}

// seedAddrs returns the static address the seed's network-config gives each
// MAC. A real guest configures a TAP-only NIC from it; the fake guest
// listens there (loopback only).
func seedAddrs(cfg *chapi.VmConfig) map[string]string { return readSeed(cfg).addrs }

// parseUserData reads #cloud-config's hostname, ssh_authorized_keys (a list)
// and ssh_keys' ed25519_private.
func (sd *seed) parseUserData(ud []byte) {
	section := ""
	for _, line := range strings.Split(string(ud), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !strings.HasPrefix(line, " ") {
			key, val, _ := strings.Cut(line, ":")
			section = key
			if key == "hostname" {
				sd.hostname = yamlScalar(val)
			}
			continue
		}
		t := strings.TrimSpace(line)
		switch {
		case section == "ssh_authorized_keys" && strings.HasPrefix(t, "- "):
			if k := yamlScalar(t[2:]); k != "" {
				sd.authorizedKeys = append(sd.authorizedKeys, k)
			}
		case section == "ssh_keys" && strings.HasPrefix(t, "ed25519_private:"):
			sd.hostKey = []byte(yamlScalar(strings.TrimPrefix(t, "ed25519_private:")))
		}
	}
}

// yamlField is the value of a top-level "key: value" line, or "".
func yamlField(b []byte, key string) string {
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			return yamlScalar(v)
		}
	}
	return ""
}

// yamlScalar decodes a double-quoted scalar (JSON's escapes are the ones
// cidata uses) or returns a plain one trimmed.
func yamlScalar(v string) string {
	v = strings.TrimSpace(v)
	if strings.HasPrefix(v, "\"") {
		var s string
		if json.Unmarshal([]byte(v), &s) == nil {
			return s
		}
		return ""
	}
	return v
}

var (
	macLine  = regexp.MustCompile(`^\s*macaddress:\s*"?([0-9A-Fa-f:]{17})"?\s*$`)
	addrLine = regexp.MustCompile(`^\s*addresses:\s*\[\s*"?([0-9.]+)/\d+"?`)
	// addrKey and addrItem are the block form of the same list, as
	// cocoon's metadata/metadata.go writes it ("addresses:" then
	// "- IP/PREFIX" lines); cloud-init reads both forms alike.
	addrKey  = regexp.MustCompile(`^(\s*)addresses:\s*$`)
	addrItem = regexp.MustCompile(`^\s*-\s*"?([0-9.]+)/\d+"?\s*$`)
	nsKey    = regexp.MustCompile(`^(\s*)nameservers:\s*$`)
)

// parseNetworkConfig maps each `match: macaddress:` of a network-config v2
// to the first address of its `addresses:` list, inline (`[...]`, the shape
// realch writes) or as a block (cocoon's). A `nameservers: addresses:` list
// holds DNS servers, not the interface's address, and is skipped.
func parseNetworkConfig(b []byte) map[string]string {
	out := map[string]string{}
	mac := ""
	inList := false // the previous line opened an interface's block address list
	nsIndent := -1  // indentation of the nameservers: key we are under (-1: none)
	for _, line := range strings.Split(string(b), "\n") {
		indent := len(line) - len(strings.TrimLeft(line, " "))
		if nsIndent >= 0 && strings.TrimSpace(line) != "" && indent <= nsIndent {
			nsIndent = -1
		}
		if m := nsKey.FindStringSubmatch(line); m != nil {
			nsIndent, inList = len(m[1]), false
			continue
		}
		if m := macLine.FindStringSubmatch(line); m != nil {
			if hw, err := net.ParseMAC(m[1]); err == nil {
				mac = hw.String()
			}
			inList = false
			continue
		}
		if m := addrLine.FindStringSubmatch(line); m != nil && mac != "" && nsIndent < 0 {
			out[mac] = m[1]
			mac = ""
			continue
		}
		if addrKey.MatchString(line) {
			inList = nsIndent < 0
			continue
		}
		if m := addrItem.FindStringSubmatch(line); m != nil && inList && mac != "" {
			out[mac] = m[1]
			mac = ""
		}
		inList = false
	}
	return out
}

// fatFile returns the named file from the root directory of a FAT12/16
// volume (long names compared without case), or false.
func fatFile(img []byte, name string) ([]byte, bool) {
	if len(img) < 512 || img[510] != 0x55 || img[511] != 0xAA {
		return nil, false
	}
	le := binary.LittleEndian
	bps, spc := int(le.Uint16(img[11:])), int(img[13])
	reserved, nfats, rootEnts, fatSz := int(le.Uint16(img[14:])), int(img[16]), int(le.Uint16(img[17:])), int(le.Uint16(img[22:]))
	if bps < 512 || bps > 4096 || spc == 0 || nfats == 0 || fatSz == 0 {
		return nil, false
	}
	fatOff := reserved * bps
	rootOff := fatOff + nfats*fatSz*bps
	dataOff := rootOff + rootEnts*32
	if dataOff > len(img) {
		return nil, false
	}
	fat := img[fatOff : fatOff+fatSz*bps]
	fat12 := (len(img)-dataOff)/(spc*bps) < 4085
	var lfn []uint16
	for e := rootOff; e+32 <= dataOff; e += 32 {
		ent := img[e : e+32]
		switch {
		case ent[0] == 0:
			return nil, false
		case ent[0] == 0xE5:
			lfn = nil
			continue
		case ent[11] == 0x0F: // a long-name part; parts come last first
			var part []uint16
			for _, r := range [][2]int{{1, 11}, {14, 26}, {28, 32}} {
				for i := r[0]; i < r[1]; i += 2 {
					part = append(part, le.Uint16(ent[i:]))
				}
			}
			lfn = append(part, lfn...)
			continue
		}
		long := strings.TrimRight(string(utf16.Decode(trimLFN(lfn))), "\x00")
		lfn = nil
		if !strings.EqualFold(long, name) {
			continue
		}
		size, c := int(le.Uint32(ent[28:])), int(le.Uint16(ent[26:]))
		var out []byte
		for c >= 2 && len(out) < size && len(out) <= len(img) {
			off := dataOff + (c-2)*spc*bps
			if off+spc*bps > len(img) {
				return nil, false
			}
			out = append(out, img[off:off+spc*bps]...)
			c = fatNext(fat, c, fat12)
		}
		if len(out) < size {
			return nil, false
		}
		return out[:size], true
	}
	return nil, false
}

func trimLFN(u []uint16) []uint16 {
	for i, c := range u {
		if c == 0 || c == 0xFFFF {
			return u[:i]
		}
	}
	return u
}

func fatNext(fat []byte, c int, fat12 bool) int {
	if fat12 {
		off := c + c/2
		if off+2 > len(fat) {
			return 0
		}
		v := int(binary.LittleEndian.Uint16(fat[off:]))
		if c%2 == 1 {
			v >>= 4
		}
		v &= 0xFFF
		if v >= 0xFF8 {
			return 0
		}
		return v
	}
	if 2*c+2 > len(fat) {
		return 0
	}
	v := int(binary.LittleEndian.Uint16(fat[2*c:]))
	if v >= 0xFFF8 {
		return 0
	}
	return v
}
