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
	if len(img) < 512 || img[510] != 0x55 || img[511] != 0xAA {
		return nil, fmt.Errorf("no boot signature")
	}
	u16 := func(o int) int { return int(binary.LittleEndian.Uint16(img[o:])) }
	bps, spc, rsvd, nfats, rootEnt := u16(11), int(img[13]), u16(14), int(img[16]), u16(17)
	tot := u16(19)
	if tot == 0 {
		tot = int(binary.LittleEndian.Uint32(img[32:]))
	}
	fatSz := u16(22)
	if bps != 512 || spc == 0 || nfats == 0 || fatSz == 0 || tot*bps > len(img) {
		return nil, fmt.Errorf("bad BPB: bps=%d spc=%d fats=%d fatsz=%d tot=%d len=%d", bps, spc, nfats, fatSz, tot, len(img))
	}
	rootSecs := (rootEnt*32 + bps - 1) / bps
	firstData := rsvd + nfats*fatSz + rootSecs
	clusters := (tot - firstData) / spc
	if clusters >= 4085 {
		return nil, fmt.Errorf("%d clusters: not FAT12", clusters)
	}
	fat := img[rsvd*bps : (rsvd+fatSz)*bps]
	// Every FAT copy must agree.
	for i := 1; i < nfats; i++ {
		if !bytes.Equal(fat, img[(rsvd+i*fatSz)*bps:(rsvd+(i+1)*fatSz)*bps]) {
			return nil, fmt.Errorf("FAT copy %d differs", i)
		}
	}
	next := func(c int) int {
		v := int(fat[c*3/2]) | int(fat[c*3/2+1])<<8
		if c&1 == 1 {
			return v >> 4
		}
		return v & 0xFFF
	}
	if next(0) != 0xF00|int(img[21]) || next(1) != 0xFFF {
		return nil, fmt.Errorf("reserved FAT entries %03x %03x", next(0), next(1))
	}
	vol := &Volume{
		BPBLabel: strings.TrimRight(string(img[43:54]), " "),
		FSType:   strings.TrimRight(string(img[54:62]), " "),
		Files:    map[string][]byte{},
		ShortOf:  map[string]string{},
	}
	root := img[(rsvd+nfats*fatSz)*bps : firstData*bps]
	var lfn []uint16
	var lfnSum byte
	seen := map[int]bool{}
	for i := 0; i < rootEnt; i++ {
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
				return nil, fmt.Errorf("entry %d: orphan or inconsistent long-name entry", i)
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
		short := string(e[0:11])
		var sum byte
		for _, b := range e[0:11] {
			sum = ((sum & 1) << 7) + (sum >> 1) + b
		}
		name := strings.TrimRight(short[:8], " ")
		if ext := strings.TrimRight(short[8:], " "); ext != "" {
			name += "." + ext
		}
		if lfn != nil {
			if sum != lfnSum {
				return nil, fmt.Errorf("%q: long name checksum %02x, alias sums to %02x", short, lfnSum, sum)
			}
			n := 0
			for n < len(lfn) && lfn[n] != 0 {
				n++
			}
			name = string(utf16.Decode(lfn[:n]))
		}
		lfn = nil
		size := int(binary.LittleEndian.Uint32(e[28:]))
		var data []byte
		for c := int(binary.LittleEndian.Uint16(e[26:])); size > 0 && c >= 2 && c < 0xFF8; c = next(c) {
			if seen[c] || c-2 >= clusters {
				return nil, fmt.Errorf("%s: cluster %d reused or out of range", name, c)
			}
			seen[c] = true
			off := (firstData + (c-2)*spc) * bps
			data = append(data, img[off:off+spc*bps]...)
		}
		if len(data) < size {
			return nil, fmt.Errorf("%s: chain holds %d bytes, size says %d", name, len(data), size)
		}
		vol.Files[name] = data[:size]
		vol.ShortOf[name] = short
	}
	return vol, nil
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
