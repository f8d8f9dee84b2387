// Package cidatatest reads FAT volumes for tests: written from the FAT
// specification, sharing no code with cidata.BuildFAT, so a test that builds
// a seed and reads it back checks the writer against the spec, not against
// itself.
package cidatatest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"unicode/utf16"
)

// Volume is what ReadFAT finds.
type Volume struct {
	BPBLabel  string
	RootLabel string
	FSType    string
	Files     map[string][]byte
	ShortOf   map[string]string
}

// ReadFAT reads a FAT12/16 volume's label and root-directory files (long
// names, and the 8.3 alias of each).
func ReadFAT(img []byte) (*Volume, error) {
	g, err := readGeometry(img)
	if err != nil {
		return nil, err
	}
	vol := &Volume{
		BPBLabel: strings.TrimRight(string(img[43:54]), " "),
		FSType:   strings.TrimRight(string(img[54:62]), " "),
		Files:    map[string][]byte{},
		ShortOf:  map[string]string{},
	}
	return vol, g.readRoot(img, vol)
}

// geometry is what the boot sector says, checked against the image.
type geometry struct {
	bps, spc, rsvd, nfats, rootEnt, fatSz, firstData, clusters int
	fat                                                        []byte
}

// next is the FAT12 entry of cluster c.
func (g *geometry) next(c int) int {
	v := int(g.fat[c*3/2]) | int(g.fat[c*3/2+1])<<8
	if c&1 == 1 {
		return v >> 4
	}
	return v & 0xFFF
}

// readGeometry reads and checks the BPB and the FATs: a FAT12 cluster
// count, identical FAT copies, the reserved entries.
func readGeometry(img []byte) (*geometry, error) {
	if len(img) < 512 || img[510] != 0x55 || img[511] != 0xAA {
		return nil, fmt.Errorf("no boot signature")
	}
	u16 := func(o int) int { return int(binary.LittleEndian.Uint16(img[o:])) }
	g := &geometry{bps: u16(11), spc: int(img[13]), rsvd: u16(14), nfats: int(img[16]), rootEnt: u16(17), fatSz: u16(22)}
	tot := u16(19)
	if tot == 0 {
		tot = int(binary.LittleEndian.Uint32(img[32:]))
	}
	if g.bps != 512 || g.spc == 0 || g.nfats == 0 || g.fatSz == 0 || tot*g.bps > len(img) {
		return nil, fmt.Errorf("bad BPB: bps=%d spc=%d fats=%d fatsz=%d tot=%d len=%d", g.bps, g.spc, g.nfats, g.fatSz, tot, len(img))
	}
	rootSecs := (g.rootEnt*32 + g.bps - 1) / g.bps
	g.firstData = g.rsvd + g.nfats*g.fatSz + rootSecs
	g.clusters = (tot - g.firstData) / g.spc
	if g.clusters >= 4085 {
		return nil, fmt.Errorf("%d clusters: not FAT12", g.clusters)
	}
	g.fat = img[g.rsvd*g.bps : (g.rsvd+g.fatSz)*g.bps]
	// Every FAT copy must agree.
	for i := 1; i < g.nfats; i++ {
		if !bytes.Equal(g.fat, img[(g.rsvd+i*g.fatSz)*g.bps:(g.rsvd+(i+1)*g.fatSz)*g.bps]) {
			return nil, fmt.Errorf("FAT copy %d differs", i)
		}
	}
	if g.next(0) != 0xF00|int(img[21]) || g.next(1) != 0xFFF {
		return nil, fmt.Errorf("reserved FAT entries %03x %03x", g.next(0), g.next(1))
	}
	return g, nil
}

// readRoot walks the root directory into vol: long-name parts (checked
// against their alias's checksum), the label, and each file's cluster chain.
func (g *geometry) readRoot(img []byte, vol *Volume) error {
	root := img[(g.rsvd+g.nfats*g.fatSz)*g.bps : g.firstData*g.bps]
	var lfn []uint16
	var lfnSum byte
	seen := map[int]bool{}
	for i := 0; i < g.rootEnt; i++ {
		e := root[i*32 : i*32+32]
		if e[0] == 0 {
			break
		}
		if e[0] == 0xE5 {
			continue
		}
		attr := e[11]
		if attr == 0x0F {
			seq := int(e[0] & 0x1F)
			if e[0]&0x40 != 0 {
				lfn = make([]uint16, seq*13)
				lfnSum = e[13]
			}
			if lfn == nil || seq == 0 || seq*13 > len(lfn) || e[13] != lfnSum {
				return fmt.Errorf("entry %d: orphan or inconsistent long-name entry", i)
			}
			var chars []uint16
			for _, o := range []int{1, 3, 5, 7, 9, 14, 16, 18, 20, 22, 24, 28, 30} {
				chars = append(chars, binary.LittleEndian.Uint16(e[o:]))
			}
			copy(lfn[(seq-1)*13:], chars)
			continue
		}
		if attr&0x08 != 0 {
			vol.RootLabel = strings.TrimRight(string(e[0:11]), " ")
			continue
		}
		name, err := entryName(e, lfn, lfnSum)
		if err != nil {
			return err
		}
		lfn = nil
		data, err := g.chain(img, e, name, seen)
		if err != nil {
			return err
		}
		vol.Files[name] = data
		vol.ShortOf[name] = string(e[0:11])
	}
	return nil
}

// entryName is a file entry's long name (lfn, when its checksum matches the
// alias) or its 8.3 name.
func entryName(e []byte, lfn []uint16, lfnSum byte) (string, error) {
	short := string(e[0:11])
	var sum byte
	for _, b := range e[0:11] {
		sum = ((sum & 1) << 7) + (sum >> 1) + b
	}
	name := strings.TrimRight(short[:8], " ")
	if ext := strings.TrimRight(short[8:], " "); ext != "" {
		name += "." + ext
	}
	if lfn == nil {
		return name, nil
	}
	if sum != lfnSum {
		return "", fmt.Errorf("%q: long name checksum %02x, alias sums to %02x", short, lfnSum, sum)
	}
	n := 0
	for n < len(lfn) && lfn[n] != 0 {
		n++
	}
	return string(utf16.Decode(lfn[:n])), nil
}

// chain reads a file entry's data along its cluster chain; a cluster used
// twice (seen) or out of range is an error.
func (g *geometry) chain(img, e []byte, name string, seen map[int]bool) ([]byte, error) {
	size := int(binary.LittleEndian.Uint32(e[28:]))
	var data []byte
	for c := int(binary.LittleEndian.Uint16(e[26:])); size > 0 && c >= 2 && c < 0xFF8; c = g.next(c) {
		if seen[c] || c-2 >= g.clusters {
			return nil, fmt.Errorf("%s: cluster %d reused or out of range", name, c)
		}
		seen[c] = true
		off := (g.firstData + (c-2)*g.spc) * g.bps
		data = append(data, img[off:off+g.spc*g.bps]...)
	}
	if len(data) < size {
		return nil, fmt.Errorf("%s: chain holds %d bytes, size says %d", name, len(data), size)
	}
	return data[:size], nil
}

// ReadFiles reads the volume image at path and returns its files.
func ReadFiles(path string) (map[string][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	vol, err := ReadFAT(b)
	if err != nil {
		return nil, err
	}
	return vol.Files, nil
}
