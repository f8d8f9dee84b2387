package fakech

import (
	"encoding/binary"
	"net"
	"os"
	"regexp"
	"strings"
	"unicode/utf16"

	"github.com/vmchaos/vmchaos/chapi"
)

// seedAddrs reads the cloud-init NoCloud seed among cfg's disks (a FAT
// volume holding network-config, as cidata.BuildCIData writes it) and
// returns the static address network-config gives each MAC. A real guest
// configures a TAP-only NIC from it; the fake guest listens there (loopback
// only). Disks that are not such a seed are skipped.
func seedAddrs(cfg *chapi.VmConfig) map[string]string {
	out := map[string]string{}
	for _, d := range cfg.Disks {
		b, err := os.ReadFile(d.Path)
		if err != nil || len(b) > 16<<20 {
			continue
		}
		nc, ok := fatFile(b, "network-config")
		if !ok {
			continue
		}
		for mac, ip := range parseNetworkConfig(nc) {
			out[mac] = ip
		}
	}
	return out
}

var (
	macLine  = regexp.MustCompile(`^\s*macaddress:\s*"?([0-9A-Fa-f:]{17})"?\s*$`)
	addrLine = regexp.MustCompile(`^\s*addresses:\s*\[\s*"?([0-9.]+)/\d+"?`)
)

// parseNetworkConfig maps each `match: macaddress:` of a network-config v2
// to the first address of its `addresses: [...]` (the shape realch writes).
func parseNetworkConfig(b []byte) map[string]string {
	out := map[string]string{}
	mac := ""
	for _, line := range strings.Split(string(b), "\n") {
		if m := macLine.FindStringSubmatch(line); m != nil {
			if hw, err := net.ParseMAC(m[1]); err == nil {
				mac = hw.String()
			}
			continue
		}
		if m := addrLine.FindStringSubmatch(line); m != nil && mac != "" {
			out[mac] = m[1]
			mac = ""
		}
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
