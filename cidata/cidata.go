// Package cidata writes the cloud-init NoCloud seed a guest learns who it is
// from at boot (host name, instance id, SSH keys, static addresses), as a
// FAT volume labelled CIDATA, and holds the kernel command line a cloud image
// boots with. A manager writes the seed for every guest; realch's launcher
// uses it too.
package cidata

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"

	"golang.org/x/crypto/ssh"

	"github.com/vmchaos/vmchaos/durable"
)

// CloudInit is what the guest learns from its NoCloud seed: who it is, which
// key the run's ledger and `vm exec` log in with, and its static address on
// the TAP (the address vmctl reports and the ledger dials).
type CloudInit struct {
	// InstanceID names this boot's identity; cloud-init re-runs its
	// per-instance modules when it changes. Empty → "vmchaos-" + Hostname.
	InstanceID string
	Hostname   string
	// SSHAuthorizedKeys go to the default user and, because the seed sets
	// disable_root: false, to root (the ledger writes under /var/lib). None:
	// only keys the image already holds let anyone in.
	SSHAuthorizedKeys []string
	// SSHHostKey, when set, is the guest's ed25519 host key (an OpenSSH
	// private key PEM). cloud-init installs it in place of generated keys,
	// so whoever wrote the seed can pin the guest's identity.
	SSHHostKey []byte
	// Interfaces configure the guest's NICs by MAC (network-config v2). Empty
	// → DHCP on every ethernet device.
	Interfaces []GuestInterface
}

// DefaultCmdline boots a cloud image's first partition on the virtio disk
// with the console on the legacy serial port (which --serial file= records).
const DefaultCmdline = "console=ttyS0 root=/dev/vda1 rw"

// GuestInterface is one NIC's static configuration inside the guest.
type GuestInterface struct {
	MAC         string   // matched against the NIC CH creates with --net mac=
	Address     string   // CIDR, e.g. 192.168.249.2/24
	Gateway     string   // optional default route
	Nameservers []string // optional
}

// CIDataLabel is the volume label cloud-init's NoCloud source looks for.
const CIDataLabel = "CIDATA"

// Compiled on first use, not at init: the bounded repeats unroll into a
// 200 KB program that took about 1 ms of every vmctl start (vmctl imports
// cidata and is exec'd dozens of times a case; GODEBUG=inittrace=1).
var (
	hostnameRE = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)
	})
	instanceRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`) })
)

// Files returns the seed's files: meta-data, user-data, network-config.
func (c CloudInit) Files() (map[string][]byte, error) {
	if !hostnameRE().MatchString(c.Hostname) || len(c.Hostname) > 253 {
		return nil, fmt.Errorf("cidata: hostname %q is not a valid host name", c.Hostname)
	}
	id := c.InstanceID
	if id == "" {
		id = "vmchaos-" + c.Hostname
	}
	if !instanceRE().MatchString(id) {
		return nil, fmt.Errorf("cidata: instance id %q: want [A-Za-z0-9._-], at most 128", id)
	}
	var ud strings.Builder
	ud.WriteString("#cloud-config\n")
	fmt.Fprintf(&ud, "hostname: %s\n", yamlString(c.Hostname))
	ud.WriteString("manage_etc_hosts: true\n")
	// Root login by key: the ledger writes /var/lib/vmchaos/ledger as root.
	ud.WriteString("disable_root: false\n")
	ud.WriteString("ssh_pwauth: false\n")
	if len(c.SSHAuthorizedKeys) > 0 {
		ud.WriteString("ssh_authorized_keys:\n")
	}
	for _, k := range c.SSHAuthorizedKeys {
		k = strings.TrimSpace(k)
		if k == "" || strings.ContainsAny(k, "\r\n") {
			return nil, fmt.Errorf("cidata: SSH key %q must be one non-empty line", clip(k, 40))
		}
		fmt.Fprintf(&ud, "  - %s\n", yamlString(k))
	}
	if err := c.hostKeys(&ud); err != nil {
		return nil, err
	}

	var md strings.Builder
	fmt.Fprintf(&md, "instance-id: %s\n", yamlString(id))
	fmt.Fprintf(&md, "local-hostname: %s\n", yamlString(c.Hostname))

	nc, err := c.networkConfig()
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		"meta-data":      []byte(md.String()),
		"user-data":      []byte(ud.String()),
		"network-config": nc,
	}, nil
}

// hostKeys adds cloud-init's ssh_keys: the host key pair, replacing any key
// the image holds (ssh_deletekeys).
func (c CloudInit) hostKeys(ud *strings.Builder) error {
	if len(c.SSHHostKey) == 0 {
		return nil
	}
	signer, err := ssh.ParsePrivateKey(c.SSHHostKey)
	if err != nil {
		return fmt.Errorf("cidata: SSH host key: %w", err)
	}
	if signer.PublicKey().Type() != ssh.KeyAlgoED25519 {
		return fmt.Errorf("cidata: SSH host key is %s, want %s", signer.PublicKey().Type(), ssh.KeyAlgoED25519)
	}
	pub := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
	ud.WriteString("ssh_deletekeys: true\nssh_keys:\n")
	fmt.Fprintf(ud, "  ed25519_private: %s\n", yamlString(string(c.SSHHostKey)))
	fmt.Fprintf(ud, "  ed25519_public: %s\n", yamlString(pub))
	return nil
}

func (c CloudInit) networkConfig() ([]byte, error) {
	var b strings.Builder
	b.WriteString("version: 2\nethernets:\n")
	if len(c.Interfaces) == 0 {
		b.WriteString("  all:\n    match:\n      name: \"e*\"\n    dhcp4: true\n")
		return []byte(b.String()), nil
	}
	for i, nic := range c.Interfaces {
		mac, err := net.ParseMAC(nic.MAC)
		if err != nil || len(mac) != 6 {
			return nil, fmt.Errorf("cidata: interface %d: MAC %q: want xx:xx:xx:xx:xx:xx", i, nic.MAC)
		}
		if _, _, err := net.ParseCIDR(nic.Address); err != nil {
			return nil, fmt.Errorf("cidata: interface %d: address %q: want CIDR (192.168.249.2/24): %v", i, nic.Address, err)
		}
		fmt.Fprintf(&b, "  nic%d:\n    match:\n      macaddress: %s\n", i, yamlString(mac.String()))
		fmt.Fprintf(&b, "    dhcp4: false\n    addresses: [%s]\n", yamlString(nic.Address))
		if nic.Gateway != "" {
			if net.ParseIP(nic.Gateway) == nil {
				return nil, fmt.Errorf("cidata: interface %d: gateway %q is not an IP", i, nic.Gateway)
			}
			fmt.Fprintf(&b, "    routes:\n      - to: default\n        via: %s\n", yamlString(nic.Gateway))
		}
		if len(nic.Nameservers) > 0 {
			var q []string
			for _, ns := range nic.Nameservers {
				if net.ParseIP(ns) == nil {
					return nil, fmt.Errorf("cidata: interface %d: nameserver %q is not an IP", i, ns)
				}
				q = append(q, yamlString(ns))
			}
			fmt.Fprintf(&b, "    nameservers:\n      addresses: [%s]\n", strings.Join(q, ", "))
		}
	}
	return []byte(b.String()), nil
}

// yamlString quotes s as a YAML double-quoted scalar; JSON's escapes are a
// subset of YAML's, so a JSON string is always a valid YAML string.
func yamlString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// BuildCIData writes the NoCloud seed volume for c at path: a FAT12
// filesystem labelled CIDATA holding meta-data, user-data and network-config,
// the same kind of volume cloud-hypervisor's integration tests make with
// `mkdosfs -n CIDATA`, but written in Go with no external tools.
func BuildCIData(path string, c CloudInit) error {
	files, err := c.Files()
	if err != nil {
		return err
	}
	img, err := BuildFAT(CIDataLabel, files)
	if err != nil {
		return fmt.Errorf("cidata %s: %w", path, err)
	}
	if err := durable.WriteFile(path, img, 0o644); err != nil {
		return fmt.Errorf("cidata %s: %w", path, err)
	}
	return nil
}

// FAT12 geometry: 512-byte sectors, 2 KiB clusters, one reserved sector, two
// FATs, a 512-entry root directory. FAT12 holds at most 4084 clusters, so a
// volume carries up to ~8 MiB of files; a seed is a few KiB.
const (
	fatSector      = 512
	fatSecPerClus  = 4
	fatCluster     = fatSector * fatSecPerClus
	fatReserved    = 1
	fatNumFATs     = 2
	fatRootEntries = 512
	fatRootSectors = fatRootEntries * 32 / fatSector
	fatMaxClusters = 4084
	fatMinSectors  = 2048 // 1 MiB: what mkdosfs users expect a seed to look like
	fatMedia       = 0xF8
)

// fatDate is the fixed timestamp of every entry (2020-01-01 00:00), so the
// same seed gives the same bytes.
const fatDate = (2020-1980)<<9 | 1<<5 | 1

// BuildFAT returns a FAT12 volume image labelled label (at most 11 bytes,
// upper-cased) whose root directory holds files, each under its long (VFAT)
// name with a generated 8.3 alias.
func BuildFAT(label string, files map[string][]byte) ([]byte, error) {
	label = strings.ToUpper(label)
	if err := checkLabel(label); err != nil {
		return nil, err
	}
	names := sortedKeys(files)
	dataClusters, err := countClusters(names, files)
	if err != nil {
		return nil, err
	}
	g := sizeFAT(dataClusters)
	img := make([]byte, g.total*fatSector)
	writeBootSector(img[:fatSector], g, label, volumeID(files))
	fat := make([]byte, g.fatSectors*fatSector)
	setFAT12(fat, 0, 0xF00|fatMedia)
	setFAT12(fat, 1, 0xFFF)
	rootOff := (fatReserved + fatNumFATs*g.fatSectors) * fatSector
	dataOff := rootOff + fatRootSectors*fatSector
	d := &fatDir{root: img[rootOff:dataOff]}
	// The volume label entry: what blkid and Windows read as the label.
	lab := make([]byte, 32)
	copy(lab[0:11], padRight(label, 11))
	lab[11] = 0x08
	binary.LittleEndian.PutUint16(lab[24:], fatDate)
	if err := d.put(lab); err != nil {
		return nil, err
	}
	if err := writeFiles(d, fat, img[dataOff:], names, files); err != nil {
		return nil, err
	}
	for i := 0; i < fatNumFATs; i++ {
		copy(img[(fatReserved+i*g.fatSectors)*fatSector:], fat)
	}
	return img, nil
}

// checkLabel accepts a volume label FAT can hold.
func checkLabel(label string) error {
	if len(label) == 0 || len(label) > 11 || strings.IndexFunc(label, func(r rune) bool {
		return r < 0x20 || r > 0x7E || strings.ContainsRune("\"*+,./:;<=>?[\\]|", r)
	}) >= 0 {
		return fmt.Errorf("fat: label %q: want 1..11 printable ASCII characters, none of \"*+,./:;<=>?[\\]|", label)
	}
	return nil
}

// countClusters checks every name and returns the data clusters the files
// take.
func countClusters(names []string, files map[string][]byte) (int, error) {
	dataClusters := 0
	folded := map[string]string{}
	for _, n := range names {
		if err := checkLongName(n); err != nil {
			return 0, err
		}
		// FAT looks names up without regard to case: "A" and "a" are one file.
		if other, ok := folded[strings.ToLower(n)]; ok {
			return 0, fmt.Errorf("fat: %q and %q are the same name on FAT", other, n)
		}
		folded[strings.ToLower(n)] = n
		dataClusters += (len(files[n]) + fatCluster - 1) / fatCluster
	}
	if dataClusters > fatMaxClusters {
		return 0, fmt.Errorf("fat: %d clusters of data exceed FAT12's %d", dataClusters, fatMaxClusters)
	}
	return dataClusters, nil
}

// fatGeometry is a volume's size in sectors and the size of each FAT.
type fatGeometry struct{ total, fatSectors int }

// sizeFAT sizes the volume: at least fatMinSectors, enough for the data plus
// slack, within FAT12's cluster limit.
func sizeFAT(dataClusters int) fatGeometry {
	clusters := dataClusters + 16
	fatSectors := (((clusters+2)*3+1)/2 + fatSector - 1) / fatSector
	total := fatReserved + fatNumFATs*fatSectors + fatRootSectors + clusters*fatSecPerClus
	if total < fatMinSectors {
		total = fatMinSectors
	}
	for {
		clusters = (total - fatReserved - fatNumFATs*fatSectors - fatRootSectors) / fatSecPerClus
		need := (((clusters+2)*3+1)/2 + fatSector - 1) / fatSector
		if need <= fatSectors {
			break
		}
		fatSectors = need
	}
	if clusters > fatMaxClusters {
		clusters = fatMaxClusters
		total = fatReserved + fatNumFATs*fatSectors + fatRootSectors + clusters*fatSecPerClus
	}
	return fatGeometry{total: total, fatSectors: fatSectors}
}

// writeBootSector fills bs with the BIOS parameter block (FAT12/16 layout).
func writeBootSector(bs []byte, g fatGeometry, label string, volID uint32) {
	le := binary.LittleEndian
	copy(bs[0:3], []byte{0xEB, 0x3C, 0x90})
	copy(bs[3:11], "VMCHAOS ")
	le.PutUint16(bs[11:], fatSector)
	bs[13] = fatSecPerClus
	le.PutUint16(bs[14:], fatReserved)
	bs[16] = fatNumFATs
	le.PutUint16(bs[17:], fatRootEntries)
	if g.total < 0x10000 {
		le.PutUint16(bs[19:], uint16(g.total))
	} else {
		le.PutUint32(bs[32:], uint32(g.total))
	}
	bs[21] = fatMedia
	le.PutUint16(bs[22:], uint16(g.fatSectors))
	le.PutUint16(bs[24:], 32) // sectors per track (geometry is nominal)
	le.PutUint16(bs[26:], 64) // heads
	bs[36] = 0x80             // drive number
	bs[38] = 0x29             // extended boot signature: the next three fields are valid
	le.PutUint32(bs[39:], volID)
	copy(bs[43:54], padRight(label, 11))
	copy(bs[54:62], "FAT12   ")
	bs[510], bs[511] = 0x55, 0xAA
}

// fatDir is the root directory being filled, one 32-byte entry at a time.
type fatDir struct {
	root []byte
	n    int
}

func (d *fatDir) put(e []byte) error {
	if d.n >= fatRootEntries {
		return errors.New("fat: root directory full")
	}
	copy(d.root[d.n*32:], e)
	d.n++
	return nil
}

// writeFiles lays the files out in cluster order from cluster 2: their
// directory entries (long name parts, then the 8.3 entry) into d, their
// cluster chains into fat, their bytes into data (the data region).
func writeFiles(d *fatDir, fat, data []byte, names []string, files map[string][]byte) error {
	le := binary.LittleEndian
	next := 2 // first data cluster
	used := map[string]bool{}
	for _, name := range names {
		body := files[name]
		short := shortName(name, used)
		for _, e := range lfnEntries(name, short) {
			if err := d.put(e); err != nil {
				return err
			}
		}
		de := make([]byte, 32)
		copy(de[0:11], short)
		de[11] = 0x20 // archive
		le.PutUint16(de[16:], fatDate)
		le.PutUint16(de[18:], fatDate)
		le.PutUint16(de[24:], fatDate)
		le.PutUint32(de[28:], uint32(len(body)))
		n := (len(body) + fatCluster - 1) / fatCluster
		if n > 0 {
			le.PutUint16(de[26:], uint16(next))
			for i := 0; i < n; i++ {
				c := next + i
				v := c + 1
				if i == n-1 {
					v = 0xFFF
				}
				setFAT12(fat, c, v)
				copy(data[(c-2)*fatCluster:], body[i*fatCluster:min(len(body), (i+1)*fatCluster)])
			}
			next += n
		}
		if err := d.put(de); err != nil {
			return err
		}
	}
	return nil
}

// checkLongName accepts what a VFAT long name can hold and read back
// unchanged: valid UTF-8, at most 255 UTF-16 units, no control characters, none of
// the reserved characters, and no trailing space or dot (both are dropped).
func checkLongName(n string) error {
	switch {
	case n == "" || n == "." || n == "..":
		return fmt.Errorf("fat: bad file name %q", n)
	case !utf8.ValidString(n):
		return fmt.Errorf("fat: file name %q is not valid UTF-8", n)
	case len(utf16.Encode([]rune(n))) > 255:
		return fmt.Errorf("fat: file name %q is longer than 255 UTF-16 units", n)
	case strings.ContainsAny(n, "/\\:*?\"<>|"):
		return fmt.Errorf("fat: file name %q holds a reserved character", n)
	case strings.IndexFunc(n, func(r rune) bool { return r < 0x20 || r == 0x7F }) >= 0:
		return fmt.Errorf("fat: file name %q holds a control character", n)
	case strings.HasSuffix(n, " ") || strings.HasSuffix(n, "."):
		return fmt.Errorf("fat: file name %q ends in a space or dot", n)
	}
	return nil
}

// setFAT12 stores the 12-bit entry for cluster c.
func setFAT12(fat []byte, c, v int) {
	off := c * 3 / 2
	if c%2 == 0 {
		fat[off] = byte(v)
		fat[off+1] = fat[off+1]&0xF0 | byte(v>>8)&0x0F
	} else {
		fat[off] = fat[off]&0x0F | byte(v<<4)
		fat[off+1] = byte(v >> 4)
	}
}

// shortName makes a unique 8.3 alias "BASE~N.EXT" for a long name. Every
// file also gets long-name entries, so the alias only has to be valid and
// unique.
func shortName(name string, used map[string]bool) string {
	clean := func(s string) string {
		var b strings.Builder
		for _, r := range strings.ToUpper(s) {
			switch {
			case r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune("!#$%&'()-@^_`{}~", r):
				b.WriteRune(r)
			}
		}
		return b.String()
	}
	base, ext := name, ""
	if i := strings.LastIndexByte(name, '.'); i > 0 {
		base, ext = name[:i], name[i+1:]
	}
	base, ext = clean(base), clean(ext)
	if len(ext) > 3 {
		ext = ext[:3]
	}
	if base == "" {
		base = "FILE"
	}
	for n := 1; ; n++ {
		tail := fmt.Sprintf("~%d", n)
		b := base
		if len(b) > 8-len(tail) {
			b = b[:8-len(tail)]
		}
		s := padRight(b+tail, 8) + padRight(ext, 3)
		if !used[s] {
			used[s] = true
			return s
		}
	}
}

// lfnEntries returns the VFAT long-name entries for name, in on-disk order
// (last fragment first), each carrying the checksum of the 8.3 alias.
func lfnEntries(name, short string) [][]byte {
	u := utf16.Encode([]rune(name))
	if len(u)%13 != 0 {
		u = append(u, 0x0000)
		for len(u)%13 != 0 {
			u = append(u, 0xFFFF)
		}
	}
	var sum byte
	for i := 0; i < 11; i++ {
		sum = (sum&1)<<7 + sum>>1 + short[i]
	}
	n := len(u) / 13
	out := make([][]byte, 0, n)
	for seq := n; seq >= 1; seq-- {
		e := make([]byte, 32)
		e[0] = byte(seq)
		if seq == n {
			e[0] |= 0x40 // last logical fragment
		}
		e[11] = 0x0F // attribute of a long-name entry
		e[13] = sum
		part := u[(seq-1)*13 : seq*13]
		offs := []int{1, 3, 5, 7, 9, 14, 16, 18, 20, 22, 24, 28, 30}
		for i, o := range offs {
			binary.LittleEndian.PutUint16(e[o:], part[i])
		}
		out = append(out, e)
	}
	return out
}

func padRight(s string, n int) string {
	if len(s) >= n {
		return s[:n]
	}
	return s + strings.Repeat(" ", n-len(s))
}

// volumeID derives the serial from the content, so equal seeds are equal
// bytes (FNV-1a over names and data).
func volumeID(files map[string][]byte) uint32 {
	h := uint32(2166136261)
	for _, n := range sortedKeys(files) {
		for _, b := range append([]byte(n), files[n]...) {
			h ^= uint32(b)
			h *= 16777619
		}
	}
	return h
}

func sortedKeys(m map[string][]byte) []string {
	return slices.Sorted(maps.Keys(m))
}

// clip shortens s to n bytes for an error message.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
