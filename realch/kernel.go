package realch

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"strings"
)

// A PVM host boots only a PVM guest kernel: one built from the virt-pvm tree
// with CONFIG_PVM_GUEST=y and CONFIG_X86_PIE=y (docs/realch.md "PVM hosts").
// InspectKernel reads a kernel file and says whether it is one, from the
// configuration the kernel embeds (CONFIG_IKCONFIG: a gzip block between the
// IKCFG_ST and IKCFG_ED markers). Without an embedded configuration it
// cannot tell, and says so.

// Kernel formats InspectKernel recognises.
const (
	KernelELF     = "elf"     // vmlinux (cloud-hypervisor loads it directly, PVH)
	KernelBzImage = "bzimage" // setup header "HdrS" at 0x202
	KernelUnknown = "unknown"
)

// The kernel options a PVM guest needs.
var pvmGuestOptions = []string{"CONFIG_PVM_GUEST", "CONFIG_X86_PIE"}

// KernelInfo is what InspectKernel read.
type KernelInfo struct {
	Path   string
	Format string
	Notes  []string          // ELF note owners and types ("Xen/18" is the PVH entry), ELF only
	Config map[string]string // the embedded .config's CONFIG_* values; nil when none is embedded
	// PVMGuest is "yes", "no" or "unknown" (no embedded configuration).
	PVMGuest string
	Why      string // the options that decided it, or why it cannot tell
}

// ikcfgStart and ikcfgEnd bracket the gzip'd .config (kernel/configs.c).
var (
	ikcfgStart = []byte("IKCFG_ST")
	ikcfgEnd   = []byte("IKCFG_ED")
)

// InspectKernel reads the kernel at path.
func InspectKernel(path string) (KernelInfo, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return KernelInfo{}, fmt.Errorf("kernel %s: %w", path, err)
	}
	k := KernelInfo{Path: path, Format: kernelFormat(b)}
	if k.Format == KernelELF {
		k.Notes, err = elfNotes(b)
		if err != nil {
			return k, fmt.Errorf("kernel %s: %w", path, err)
		}
	}
	k.Config, err = embeddedConfig(b)
	if err != nil {
		return k, fmt.Errorf("kernel %s: %w", path, err)
	}
	k.PVMGuest, k.Why = pvmGuestVerdict(k.Format, k.Config)
	return k, nil
}

// KernelVerdict is InspectKernel as one line for the preflight.
func KernelVerdict(path string) string {
	k, err := InspectKernel(path)
	if err != nil {
		return "unreadable: " + err.Error()
	}
	return k.String()
}

func (k KernelInfo) String() string {
	s := fmt.Sprintf("%s (%s): PVM guest %s: %s", k.Path, k.Format, k.PVMGuest, k.Why)
	if len(k.Notes) > 0 {
		s += "; ELF notes " + strings.Join(k.Notes, " ")
	}
	return s
}

func kernelFormat(b []byte) string {
	switch {
	case bytes.HasPrefix(b, []byte(elf.ELFMAG)):
		return KernelELF
	case len(b) >= 0x206 && string(b[0x202:0x206]) == "HdrS":
		return KernelBzImage
	}
	return KernelUnknown
}

// elfNotes lists the owner/type of every note in the ELF's PT_NOTE segments.
func elfNotes(b []byte) ([]string, error) {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("ELF: %w", err)
	}
	var out []string
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		data, err := io.ReadAll(p.Open())
		if err != nil {
			return nil, fmt.Errorf("ELF note segment: %w", err)
		}
		out = append(out, parseNotes(data, f.ByteOrder)...)
	}
	return out, nil
}

// parseNotes walks Elf_Nhdr records: namesz, descsz, type, then the name and
// the descriptor, each padded to 4 bytes.
func parseNotes(data []byte, bo binary.ByteOrder) []string {
	var out []string
	pad := func(n uint32) int { return int((n + 3) &^ 3) }
	for len(data) >= 12 {
		namesz, descsz, typ := bo.Uint32(data), bo.Uint32(data[4:]), bo.Uint32(data[8:])
		data = data[12:]
		if pad(namesz) > len(data) {
			break
		}
		name := strings.TrimRight(string(data[:namesz]), "\x00")
		data = data[pad(namesz):]
		if pad(descsz) > len(data) {
			break
		}
		data = data[pad(descsz):]
		out = append(out, fmt.Sprintf("%s/%d", name, typ))
	}
	return out
}

// embeddedConfig finds and inflates the IKCONFIG block; nil when absent.
func embeddedConfig(b []byte) (map[string]string, error) {
	i := bytes.Index(b, ikcfgStart)
	if i < 0 {
		return nil, nil
	}
	rest := b[i+len(ikcfgStart):]
	j := bytes.Index(rest, ikcfgEnd)
	if j < 0 {
		return nil, fmt.Errorf("embedded config: IKCFG_ST without IKCFG_ED")
	}
	zr, err := gzip.NewReader(bytes.NewReader(rest[:j]))
	if err != nil {
		return nil, fmt.Errorf("embedded config: %w", err)
	}
	cfg := map[string]string{}
	sc := bufio.NewScanner(zr)
	for sc.Scan() {
		line := sc.Text()
		if k, v, ok := strings.Cut(line, "="); ok && strings.HasPrefix(k, "CONFIG_") {
			cfg[k] = v
		} else if k, ok := strings.CutPrefix(line, "# "); ok && strings.HasSuffix(k, " is not set") {
			cfg[strings.TrimSuffix(k, " is not set")] = "n"
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("embedded config: %w", err)
	}
	return cfg, nil
}

func pvmGuestVerdict(format string, cfg map[string]string) (string, string) {
	if cfg == nil {
		why := "no embedded configuration (IKCFG_ST) to read CONFIG_PVM_GUEST and CONFIG_X86_PIE from"
		if format == KernelBzImage {
			why += "; a bzImage compresses it with the kernel: extract the vmlinux (scripts/extract-vmlinux) or check the build's .config"
		}
		return "unknown", why
	}
	var have, lack []string
	for _, o := range pvmGuestOptions {
		if cfg[o] == "y" {
			have = append(have, o+"=y")
		} else {
			lack = append(lack, o+" is not y")
		}
	}
	if len(lack) > 0 {
		return "no", strings.Join(lack, ", ") + " (a PVM host needs both, from the virt-pvm tree)"
	}
	return "yes", strings.Join(have, ", ")
}
