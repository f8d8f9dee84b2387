// Package qcow2 reads and writes the subset of QEMU's qcow2 format (version 2
// and 3) the fake guest needs: a disk whose clusters are read through a chain
// of backing files and written copy-on-write to the top image, with L1/L2
// tables and refcounts kept so qemu-img check stays clean. Compression,
// encryption, internal snapshots, external data files and extended L2
// entries are refused. The format is QEMU's docs/interop/qcow2.txt.
package qcow2

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Magic is the first four bytes of a qcow2 file ("QFI\xfb").
const Magic = 0x514649fb

const (
	offsetMask     = 0x00fffffffffffe00 // host cluster offset in L1/L2/refcount-table entries
	flagCopied     = uint64(1) << 63    // refcount is exactly 1: may be written in place
	flagCompressed = uint64(1) << 62
	flagZero       = uint64(1) // v3 L2: the cluster reads as zeros

	incompatDirty   = 1 << 0
	incompatCorrupt = 1 << 1
	maxL1Bytes      = 32 << 20 // refuse absurd tables from a hostile header
	maxBackingDepth = 16
	maxBackingName  = 1023
)

// ErrNotQcow2 marks a file that does not start with the qcow2 magic.
var ErrNotQcow2 = errors.New("not a qcow2 image")

type header struct {
	Magic                 uint32
	Version               uint32
	BackingFileOffset     uint64
	BackingFileSize       uint32
	ClusterBits           uint32
	Size                  uint64
	CryptMethod           uint32
	L1Size                uint32
	L1TableOffset         uint64
	RefcountTableOffset   uint64
	RefcountTableClusters uint32
	NbSnapshots           uint32
	SnapshotsOffset       uint64
	// version 3
	IncompatibleFeatures uint64
	CompatibleFeatures   uint64
	AutoclearFeatures    uint64
	RefcountOrder        uint32
	HeaderLength         uint32
}

const v2HeaderLen = 72

// Image is one open qcow2 file and, below it, its backing chain.
type Image struct {
	f        *os.File
	path     string
	writable bool
	hdr      header
	cs       int64 // cluster size
	l2n      int64 // entries per L2 table
	l1       []uint64
	refTable []uint64
	end      int64 // next free host offset (cluster aligned)
	backing  backingFile
}

// backingFile is what unallocated clusters read from: another qcow2 image or
// a raw file (nil: zeros).
type backingFile interface {
	ReadAt(p []byte, off int64) (int, error)
	Close() error
}

type rawBacking struct {
	f    *os.File
	size int64
}

func (r *rawBacking) ReadAt(p []byte, off int64) (int, error) {
	clear(p)
	if off >= r.size {
		return len(p), nil
	}
	n := min(int64(len(p)), r.size-off)
	if _, err := r.f.ReadAt(p[:n], off); err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	return len(p), nil
}

func (r *rawBacking) Close() error { return r.f.Close() }

// IsQcow2 reports whether b starts with the qcow2 magic.
func IsQcow2(b []byte) bool { return len(b) >= 4 && binary.BigEndian.Uint32(b) == Magic }

// Open opens path and its backing chain. writable opens the top image for
// writing; backing files are always read-only.
func Open(path string, writable bool) (*Image, error) {
	flag := os.O_RDONLY
	if writable {
		flag = os.O_RDWR
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, err
	}
	im, err := OpenFile(f, writable)
	if err != nil {
		f.Close()
		return nil, err
	}
	return im, nil
}

// OpenFile is Open on a file already open (the fake VMM's locked fd); the
// Image owns f from here on.
func OpenFile(f *os.File, writable bool) (*Image, error) {
	return openDepth(f, writable, 0)
}

func openDepth(f *os.File, writable bool, depth int) (*Image, error) {
	im := &Image{f: f, path: f.Name(), writable: writable}
	if err := im.readHeader(); err != nil {
		return nil, fmt.Errorf("qcow2 %s: %w", im.path, err)
	}
	if err := im.openBacking(depth); err != nil {
		return nil, fmt.Errorf("qcow2 %s: %w", im.path, err)
	}
	return im, nil
}

func (im *Image) readHeader() error {
	buf := make([]byte, 104)
	n, err := im.f.ReadAt(buf, 0)
	if n < 4 || binary.BigEndian.Uint32(buf) != Magic {
		return ErrNotQcow2
	}
	if n < v2HeaderLen {
		return fmt.Errorf("header: %d bytes: %w", n, io.ErrUnexpectedEOF)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	h := &im.hdr
	be := binary.BigEndian
	h.Magic, h.Version = be.Uint32(buf[0:]), be.Uint32(buf[4:])
	h.BackingFileOffset, h.BackingFileSize = be.Uint64(buf[8:]), be.Uint32(buf[16:])
	h.ClusterBits, h.Size, h.CryptMethod = be.Uint32(buf[20:]), be.Uint64(buf[24:]), be.Uint32(buf[32:])
	h.L1Size, h.L1TableOffset = be.Uint32(buf[36:]), be.Uint64(buf[40:])
	h.RefcountTableOffset, h.RefcountTableClusters = be.Uint64(buf[48:]), be.Uint32(buf[56:])
	h.NbSnapshots, h.SnapshotsOffset = be.Uint32(buf[60:]), be.Uint64(buf[64:])
	switch h.Version {
	case 2:
		h.RefcountOrder, h.HeaderLength = 4, v2HeaderLen
	case 3:
		if n < 104 {
			return fmt.Errorf("v3 header: %d bytes: %w", n, io.ErrUnexpectedEOF)
		}
		h.IncompatibleFeatures, h.CompatibleFeatures = be.Uint64(buf[72:]), be.Uint64(buf[80:])
		h.AutoclearFeatures, h.RefcountOrder, h.HeaderLength = be.Uint64(buf[88:]), be.Uint32(buf[96:]), be.Uint32(buf[100:])
	default:
		return fmt.Errorf("version %d not supported", h.Version)
	}
	if h.ClusterBits < 9 || h.ClusterBits > 21 {
		return fmt.Errorf("cluster_bits %d out of range", h.ClusterBits)
	}
	if h.CryptMethod != 0 {
		return errors.New("encrypted images are not supported")
	}
	if f := h.IncompatibleFeatures &^ incompatDirty; f != 0 {
		return fmt.Errorf("incompatible features %#x not supported", f)
	}
	if h.RefcountOrder > 6 {
		return fmt.Errorf("refcount_order %d out of range", h.RefcountOrder)
	}
	if im.writable && (h.NbSnapshots != 0 || h.RefcountOrder != 4) {
		return errors.New("writes need an image without internal snapshots and with 16-bit refcounts")
	}
	im.cs = int64(1) << h.ClusterBits
	im.l2n = im.cs / 8
	if h.Size > 1<<50 {
		return fmt.Errorf("virtual size %d too large", h.Size)
	}
	need := (int64(h.Size) + im.cs*im.l2n - 1) / (im.cs * im.l2n)
	if int64(h.L1Size) < need || int64(h.L1Size)*8 > maxL1Bytes {
		return fmt.Errorf("l1_size %d does not fit virtual size %d", h.L1Size, h.Size)
	}
	if h.L1TableOffset%uint64(im.cs) != 0 || h.RefcountTableOffset%uint64(im.cs) != 0 {
		return errors.New("unaligned table offset")
	}
	var err2 error
	if im.l1, err2 = im.readTable(int64(h.L1TableOffset), int64(h.L1Size)); err2 != nil {
		return fmt.Errorf("L1 table: %w", err2)
	}
	if int64(h.RefcountTableClusters)*im.cs > maxL1Bytes {
		return fmt.Errorf("refcount table of %d clusters too large", h.RefcountTableClusters)
	}
	if im.refTable, err2 = im.readTable(int64(h.RefcountTableOffset), int64(h.RefcountTableClusters)*im.cs/8); err2 != nil {
		return fmt.Errorf("refcount table: %w", err2)
	}
	fi, err := im.f.Stat()
	if err != nil {
		return err
	}
	im.end = (fi.Size() + im.cs - 1) / im.cs * im.cs
	return nil
}

func (im *Image) readTable(off, n int64) ([]uint64, error) {
	b := make([]byte, n*8)
	if _, err := im.f.ReadAt(b, off); err != nil && !(errors.Is(err, io.EOF) && n == 0) {
		return nil, err
	}
	t := make([]uint64, n)
	for i := range t {
		t[i] = binary.BigEndian.Uint64(b[i*8:])
	}
	return t, nil
}

func (im *Image) openBacking(depth int) error {
	h := im.hdr
	if h.BackingFileOffset == 0 || h.BackingFileSize == 0 {
		return nil
	}
	if depth >= maxBackingDepth {
		return errors.New("backing chain too deep")
	}
	if h.BackingFileSize > maxBackingName {
		return fmt.Errorf("backing file name of %d bytes", h.BackingFileSize)
	}
	name := make([]byte, h.BackingFileSize)
	if _, err := im.f.ReadAt(name, int64(h.BackingFileOffset)); err != nil {
		return fmt.Errorf("backing file name: %w", err)
	}
	p := string(name)
	if !filepath.IsAbs(p) {
		p = filepath.Join(filepath.Dir(im.path), p)
	}
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("backing file: %w", err)
	}
	var magic [4]byte
	if n, _ := f.ReadAt(magic[:], 0); n == 4 && IsQcow2(magic[:]) {
		b, err := openDepth(f, false, depth+1)
		if err != nil {
			f.Close()
			return err
		}
		im.backing = b
		return nil
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	im.backing = &rawBacking{f: f, size: fi.Size()}
	return nil
}

// Size is the virtual disk size.
func (im *Image) Size() int64 { return int64(im.hdr.Size) }

// HasBacking reports whether the image has a backing file.
func (im *Image) HasBacking() bool { return im.backing != nil }

// Close closes the image and its backing chain.
func (im *Image) Close() error {
	if im.backing != nil {
		im.backing.Close()
	}
	return im.f.Close()
}

// l2Entry returns the L2 entry of virtual cluster c (0: unallocated).
func (im *Image) l2Entry(c int64) (uint64, error) {
	l1i := c / im.l2n
	if l1i >= int64(len(im.l1)) {
		return 0, fmt.Errorf("cluster %d beyond the L1 table", c)
	}
	l2off := int64(im.l1[l1i] & offsetMask)
	if l2off == 0 {
		return 0, nil
	}
	var b [8]byte
	if _, err := im.f.ReadAt(b[:], l2off+(c%im.l2n)*8); err != nil {
		return 0, fmt.Errorf("L2 entry of cluster %d: %w", c, err)
	}
	return binary.BigEndian.Uint64(b[:]), nil
}

// ReadAt reads virtual bytes; unallocated clusters read from the backing
// chain, or as zeros.
func (im *Image) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > im.Size() {
		return 0, fmt.Errorf("read [%d,+%d) outside the %d-byte disk", off, len(p), im.Size())
	}
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		c, in := pos/im.cs, pos%im.cs
		n := min(int64(len(p)-done), im.cs-in)
		if err := im.readCluster(p[done:done+int(n)], c, in); err != nil {
			return done, err
		}
		done += int(n)
	}
	return done, nil
}

func (im *Image) readCluster(p []byte, c, in int64) error {
	e, err := im.l2Entry(c)
	if err != nil {
		return err
	}
	switch {
	case e&flagCompressed != 0:
		return fmt.Errorf("cluster %d is compressed: not supported", c)
	case im.hdr.Version >= 3 && e&flagZero != 0:
		clear(p)
		return nil
	case e&offsetMask != 0:
		_, err := im.f.ReadAt(p, int64(e&offsetMask)+in)
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("cluster %d: host offset %d beyond the file", c, e&offsetMask)
		}
		return err
	case im.backing != nil:
		// An overlay may be larger than its backing file: past the
		// backing's end it reads zeros.
		off := c*im.cs + in
		n := int64(len(p))
		if b, ok := im.backing.(*Image); ok {
			n = max(0, min(n, b.Size()-off))
		}
		clear(p[n:])
		if n == 0 {
			return nil
		}
		_, err := im.backing.ReadAt(p[:n], off)
		return err
	}
	clear(p)
	return nil
}

// AllocatedEnd is the end of the last virtual cluster allocated anywhere in
// the chain: reading [0, AllocatedEnd) reads everything ever written.
func (im *Image) AllocatedEnd() (int64, error) {
	end := int64(0)
	if b, ok := im.backing.(*Image); ok {
		var err error
		if end, err = b.AllocatedEnd(); err != nil {
			return 0, err
		}
	} else if r, ok := im.backing.(*rawBacking); ok {
		end = r.size
	}
	for l1i := int64(len(im.l1)) - 1; l1i >= 0; l1i-- {
		l2off := int64(im.l1[l1i] & offsetMask)
		if l2off == 0 {
			continue
		}
		t, err := im.readTable(l2off, im.l2n)
		if err != nil {
			return 0, fmt.Errorf("L2 table: %w", err)
		}
		for i := im.l2n - 1; i >= 0; i-- {
			if t[i] != 0 {
				return max(end, min(im.Size(), (l1i*im.l2n+i+1)*im.cs)), nil
			}
		}
	}
	return min(end, im.Size()), nil
}

// WriteAt writes virtual bytes to the top image, copying a cluster up from
// the backing chain before its first write.
func (im *Image) WriteAt(p []byte, off int64) (int, error) {
	if !im.writable {
		return 0, errors.New("qcow2: image opened read-only")
	}
	if off < 0 || off+int64(len(p)) > im.Size() {
		return 0, fmt.Errorf("write [%d,+%d) outside the %d-byte disk", off, len(p), im.Size())
	}
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		c, in := pos/im.cs, pos%im.cs
		n := min(int64(len(p)-done), im.cs-in)
		if err := im.writeCluster(p[done:done+int(n)], c, in); err != nil {
			return done, err
		}
		done += int(n)
	}
	return done, nil
}

func (im *Image) writeCluster(p []byte, c, in int64) error {
	e, err := im.l2Entry(c)
	if err != nil {
		return err
	}
	if e&flagCompressed != 0 {
		return fmt.Errorf("cluster %d is compressed: not supported", c)
	}
	if host := int64(e & offsetMask); host != 0 && e&flagCopied != 0 && e&flagZero == 0 {
		_, err := im.f.WriteAt(p, host+in)
		return err
	}
	// Copy on write: the whole cluster as it reads now, then this write.
	buf := make([]byte, im.cs)
	if err := im.readCluster(buf, c, 0); err != nil {
		return err
	}
	copy(buf[in:], p)
	host, err := im.alloc()
	if err != nil {
		return err
	}
	if _, err := im.f.WriteAt(buf, host); err != nil {
		return err
	}
	l2off, err := im.l2Table(c / im.l2n)
	if err != nil {
		return err
	}
	return im.putU64(l2off+(c%im.l2n)*8, uint64(host)|flagCopied)
}

// l2Table returns the host offset of L2 table l1i, allocating it.
func (im *Image) l2Table(l1i int64) (int64, error) {
	if off := int64(im.l1[l1i] & offsetMask); off != 0 {
		if im.l1[l1i]&flagCopied == 0 {
			return 0, fmt.Errorf("L2 table %d is shared: not supported", l1i)
		}
		return off, nil
	}
	off, err := im.alloc()
	if err != nil {
		return 0, err
	}
	if _, err := im.f.WriteAt(make([]byte, im.cs), off); err != nil {
		return 0, err
	}
	im.l1[l1i] = uint64(off) | flagCopied
	return off, im.putU64(int64(im.hdr.L1TableOffset)+l1i*8, im.l1[l1i])
}

// alloc appends a cluster and gives it refcount 1.
func (im *Image) alloc() (int64, error) {
	off := im.end
	im.end += im.cs
	if err := im.f.Truncate(im.end); err != nil {
		return 0, err
	}
	return off, im.setRefcount(off/im.cs, 1)
}

// setRefcount sets the 16-bit refcount of host cluster idx, allocating the
// refcount block that covers it.
func (im *Image) setRefcount(idx int64, v uint16) error {
	per := im.cs / 2
	rbi := idx / per
	if rbi >= int64(len(im.refTable)) {
		return fmt.Errorf("refcount table full (cluster %d)", idx)
	}
	blk := int64(im.refTable[rbi] & offsetMask)
	if blk == 0 {
		blk = im.end
		im.end += im.cs
		if _, err := im.f.WriteAt(make([]byte, im.cs), blk); err != nil {
			return err
		}
		im.refTable[rbi] = uint64(blk)
		if err := im.putU64(int64(im.hdr.RefcountTableOffset)+rbi*8, uint64(blk)); err != nil {
			return err
		}
		if err := im.setRefcount(blk/im.cs, 1); err != nil {
			return err
		}
	}
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	_, err := im.f.WriteAt(b[:], blk+(idx%per)*2)
	return err
}

func (im *Image) putU64(off int64, v uint64) error {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	_, err := im.f.WriteAt(b[:], off)
	return err
}

// Sync flushes the top image to stable storage.
func (im *Image) Sync() error { return im.f.Sync() }

// Create writes an empty qcow2 v3 image of size bytes (64 KiB clusters,
// 16-bit refcounts), with backing as its backing file ("" for none;
// backingFmt "qcow2" or "raw").
func Create(path string, size int64, backing, backingFmt string) error {
	const bits = 16
	cs := int64(1) << bits
	l2n := cs / 8
	if size <= 0 || size > 1<<44 {
		return fmt.Errorf("qcow2 create: size %d out of range", size)
	}
	if len(backing) > maxBackingName {
		return errors.New("qcow2 create: backing file name too long")
	}
	l1Size := (size + cs*l2n - 1) / (cs * l2n)
	l1Clusters := (l1Size*8 + cs - 1) / cs
	// cluster 0 header, 1 refcount table, 2 refcount block, 3.. L1 table
	total := 3 + l1Clusters
	img := make([]byte, total*cs)
	be := binary.BigEndian
	be.PutUint32(img[0:], Magic)
	be.PutUint32(img[4:], 3)
	be.PutUint32(img[20:], bits)
	be.PutUint64(img[24:], uint64(size))
	be.PutUint32(img[36:], uint32(l1Size))
	be.PutUint64(img[40:], uint64(3*cs))
	be.PutUint64(img[48:], uint64(cs))
	be.PutUint32(img[56:], 1)
	be.PutUint32(img[96:], 4)    // refcount_order: 16-bit
	be.PutUint32(img[100:], 104) // header_length
	ext := 104
	if backing != "" {
		if backingFmt != "" {
			// header extension 0xe2792aca: backing file format name
			be.PutUint32(img[ext:], 0xe2792aca)
			be.PutUint32(img[ext+4:], uint32(len(backingFmt)))
			copy(img[ext+8:], backingFmt)
			ext += 8 + (len(backingFmt)+7)/8*8
		}
	}
	ext += 8 // end-of-extensions marker (zeros)
	if backing != "" {
		be.PutUint64(img[8:], uint64(ext))
		be.PutUint32(img[16:], uint32(len(backing)))
		copy(img[ext:], backing)
	}
	be.PutUint64(img[cs:], uint64(2*cs)) // refcount table → block at cluster 2
	for i := int64(0); i < total; i++ {
		be.PutUint16(img[2*cs+i*2:], 1)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(img); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
