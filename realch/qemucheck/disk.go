package qemucheck

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"
)

// The host's view of the guest's disk: what is on the image file itself,
// read with e2fsprogs after QEMU has exited (nothing of the guest's page
// cache, nothing QEMU holds), so "on disk" means on the image.

// rootPartitionOffset is the byte offset of the first MBR partition of the
// raw image (the root file system, root=/dev/vda1).
func rootPartitionOffset(disk string) (int64, error) {
	f, err := os.Open(disk)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var mbr [512]byte
	if _, err := io.ReadFull(f, mbr[:]); err != nil {
		return 0, fmt.Errorf("%s: read MBR: %w", disk, err)
	}
	return parseMBR(mbr[:])
}

// parseMBR is the start of the first partition of an MBR, in bytes.
func parseMBR(mbr []byte) (int64, error) {
	if len(mbr) < 512 || mbr[510] != 0x55 || mbr[511] != 0xaa {
		return 0, errors.New("no MBR signature: want a raw disk with a partition table (vmchaos image real's guest.raw)")
	}
	e := mbr[446:462]
	if e[4] == 0 {
		return 0, errors.New("MBR: the first partition entry is empty")
	}
	lba := binary.LittleEndian.Uint32(e[8:12])
	if lba == 0 {
		return 0, errors.New("MBR: the first partition starts at sector 0")
	}
	return int64(lba) * 512, nil
}

// fsSpec is how e2fsprogs opens the file system inside the image: unix_io's
// offset option, no loop device, no mount.
func fsSpec(disk string, off int64) string { return fmt.Sprintf("%s?offset=%d", disk, off) }

// listDir lists dir in the image's root file system (debugfs `ls -p`).
func listDir(ctx context.Context, disk string, off int64, dir string) ([]string, error) {
	cmd := exec.CommandContext(ctx, "debugfs", "-R", "ls -p "+dir, fsSpec(disk, off))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("debugfs ls %s: %w: %s", dir, err, strings.TrimSpace(errb.String()))
	}
	// debugfs reports a missing path on stderr and exits 0.
	if strings.Contains(errb.String(), "File not found") {
		return nil, fmt.Errorf("debugfs ls %s: %s", dir, strings.TrimSpace(errb.String()))
	}
	return parseLsP(out.String()), nil
}

// parseLsP reads debugfs's `ls -p` lines, /inode/mode/uid/gid/name/size/,
// and returns the names other than . and .. .
func parseLsP(s string) []string {
	var names []string
	for _, ln := range strings.Split(s, "\n") {
		f := strings.Split(strings.TrimSpace(ln), "/")
		if len(f) < 7 || f[0] != "" {
			continue
		}
		// A name may hold "/" only as escaped by debugfs; take the fifth field.
		if n := f[5]; n != "" && n != "." && n != ".." {
			names = append(names, n)
		}
	}
	return names
}

// fsckClean runs a read-only forced e2fsck on the image's root file system:
// nil when it finds nothing (exit 0), its output otherwise.
func fsckClean(ctx context.Context, disk string, off int64) (string, error) {
	cmd := exec.CommandContext(ctx, "e2fsck", "-f", "-n", fsSpec(disk, off))
	out, err := cmd.CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err != nil {
		return s, fmt.Errorf("e2fsck -fn: %w: %s", err, s)
	}
	return s, nil
}

// diskCache is the QEMU cache mode that makes a guest flush an fsync of the
// image: none (O_DIRECT) where the file system takes O_DIRECT, else
// writethrough (every write is followed by an fdatasync).
func diskCache(path string) string {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return "writethrough"
	}
	unix.Close(fd)
	return "none"
}

// copySparse copies the image for this run (reflinked where the file
// system can, sparse otherwise): the check writes into its copy, never into
// the built image.
func copySparse(ctx context.Context, src, dst string) error {
	out, err := exec.CommandContext(ctx, "cp", "--sparse=always", "--reflink=auto", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy %s: %w: %s", src, err, strings.TrimSpace(string(out)))
	}
	return nil
}
