package realch

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ikconfigBlock is kernel/configs.c's layout: IKCFG_ST, the gzip'd
// .config, IKCFG_ED.
func ikconfigBlock(t *testing.T, config string) []byte {
	t.Helper()
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	if _, err := zw.Write([]byte(config)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return append(append(append([]byte{}, ikcfgStart...), z.Bytes()...), ikcfgEnd...)
}

// note is one Elf_Nhdr record with its padded name and descriptor.
func note(name string, typ uint32, desc []byte) []byte {
	var b bytes.Buffer
	n := append([]byte(name), 0)
	for _, v := range []uint32{uint32(len(n)), uint32(len(desc)), typ} {
		_ = binary.Write(&b, binary.LittleEndian, v)
	}
	b.Write(n)
	b.Write(make([]byte, (4-len(n)%4)%4))
	b.Write(desc)
	b.Write(make([]byte, (4-len(desc)%4)%4))
	return b.Bytes()
}

// minimalELF is an x86-64 ELF with one PT_NOTE segment holding notes, then
// tail (an IKCONFIG block, say) after it, the way vmlinux carries .rodata.
func minimalELF(t *testing.T, notes, tail []byte) []byte {
	t.Helper()
	const ehsize, phsize = 64, 56
	var b bytes.Buffer
	h := elf.Header64{Type: uint16(elf.ET_EXEC), Machine: uint16(elf.EM_X86_64), Version: uint32(elf.EV_CURRENT),
		Phoff: ehsize, Ehsize: ehsize, Phentsize: phsize, Phnum: 1}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS], h.Ident[elf.EI_DATA], h.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	p := elf.Prog64{Type: uint32(elf.PT_NOTE), Off: ehsize + phsize, Filesz: uint64(len(notes)), Memsz: uint64(len(notes)), Align: 4}
	for _, v := range []any{h, p} {
		if err := binary.Write(&b, binary.LittleEndian, v); err != nil {
			t.Fatal(err)
		}
	}
	b.Write(notes)
	b.Write(tail)
	return b.Bytes()
}

// bzImage is a file with the setup header's "HdrS" at 0x202, then tail.
func bzImage(tail []byte) []byte {
	b := make([]byte, 0x400)
	copy(b[0x202:], "HdrS")
	return append(b, tail...)
}

const (
	pvmConfig   = "#\n# Linux/x86 6.7.0 Kernel Configuration\n#\nCONFIG_X86_64=y\nCONFIG_X86_PIE=y\nCONFIG_PVM_GUEST=y\nCONFIG_KVM=m\n"
	noPIEConfig = "CONFIG_X86_64=y\nCONFIG_PVM_GUEST=y\n# CONFIG_X86_PIE is not set\n"
	stockConfig = "CONFIG_X86_64=y\nCONFIG_KVM_GUEST=y\n"
)

func TestInspectKernel(t *testing.T) {
	pvhNote := note("Xen", 18, []byte{0, 0, 0, 1})
	for _, tc := range []struct {
		name, format, pvm string
		file              []byte
		why, notes        string
	}{
		{"PVM vmlinux", KernelELF, "yes", minimalELF(t, pvhNote, ikconfigBlock(t, pvmConfig)), "CONFIG_PVM_GUEST=y, CONFIG_X86_PIE=y", "Xen/18"},
		{"vmlinux without PIE", KernelELF, "no", minimalELF(t, pvhNote, ikconfigBlock(t, noPIEConfig)), "CONFIG_X86_PIE is not y", "Xen/18"},
		{"stock vmlinux", KernelELF, "no", minimalELF(t, note("Linux", 6, []byte("6.1")), ikconfigBlock(t, stockConfig)), "CONFIG_PVM_GUEST is not y, CONFIG_X86_PIE is not y", "Linux/6"},
		{"vmlinux without IKCONFIG", KernelELF, "unknown", minimalELF(t, pvhNote, nil), "no embedded configuration", "Xen/18"},
		{"bzImage", KernelBzImage, "unknown", bzImage([]byte("compressed payload")), "a bzImage compresses it", ""},
		{"bzImage with a config", KernelBzImage, "yes", bzImage(ikconfigBlock(t, pvmConfig)), "CONFIG_PVM_GUEST=y", ""},
		{"not a kernel", KernelUnknown, "unknown", []byte("hello"), "no embedded configuration", ""},
	} {
		p := filepath.Join(t.TempDir(), "kernel")
		if err := os.WriteFile(p, tc.file, 0o644); err != nil {
			t.Fatal(err)
		}
		k, err := InspectKernel(p)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if k.Format != tc.format || k.PVMGuest != tc.pvm || !strings.Contains(k.Why, tc.why) || strings.Join(k.Notes, " ") != tc.notes {
			t.Errorf("%s: got %+v, want format %s, PVM guest %s, why ~%q, notes %q", tc.name, k, tc.format, tc.pvm, tc.why, tc.notes)
		}
		if v := KernelVerdict(p); !strings.Contains(v, ": PVM guest "+tc.pvm+":") { // doctor reads this phrase
			t.Errorf("%s: verdict %q", tc.name, v)
		}
	}
}

func TestInspectKernelErrors(t *testing.T) {
	dir := t.TempDir()
	broken := append(append([]byte{}, ikcfgStart...), []byte("not gzip")...)
	broken = append(broken, ikcfgEnd...)
	for name, b := range map[string][]byte{
		"truncated ELF":          append([]byte(elf.ELFMAG), 2, 1, 1),
		"IKCFG_ST without end":   bzImage(ikcfgStart),
		"IKCFG block not gzip'd": bzImage(broken),
	} {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if k, err := InspectKernel(p); err == nil {
			t.Errorf("%s: no error, got %+v", name, k)
		}
	}
	if _, err := InspectKernel(filepath.Join(dir, "absent")); err == nil {
		t.Error("absent file: no error")
	}
}
