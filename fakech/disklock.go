package fakech

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/fakech/qcow2"
)

// lockDisks opens every disk of cfg and takes CH's advisory lock on it: an
// OFD lock over the image's byte range, write for a read-write disk, read
// for a read-only one (block/src/fcntl.rs try_acquire_lock,
// virtio-devices/src/block.rs try_lock_image), taken when the VM boots or
// is restored (vm.rs Vm::boot, Vm::restore). A second VMM on the same image
// fails; the lock goes with the last fd, so a killed VMM releases it. The
// caller holds v.mu; the files stay open until teardown.
func (v *VMM) lockDisks(cfg *chapi.VmConfig) error {
	locked := map[string]*os.File{}
	qcows := map[string]*qcow2.Image{}
	undo := func() {
		for id, f := range locked {
			if q := qcows[id]; q != nil {
				q.Close()
			} else {
				f.Close()
			}
		}
	}
	for _, d := range cfg.Disks {
		if d.Path == "" {
			continue
		}
		f, err := lockImage(d.Path, d.Readonly)
		if err != nil {
			undo()
			return err
		}
		locked[d.ID] = f
		var magic [4]byte
		if n, _ := f.ReadAt(magic[:], 0); n == 4 && qcow2.IsQcow2(magic[:]) {
			q, err := qcow2.OpenFile(f, !d.Readonly)
			if err != nil {
				undo()
				return chainErr{"Failed to open disk image " + d.Path, err.Error()}
			}
			qcows[d.ID] = q
		}
	}
	v.releaseDisks()
	v.disks, v.qcows = locked, qcows
	return nil
}

func lockImage(path string, readonly bool) (*os.File, error) {
	flag, typ, name := os.O_RDWR, int16(unix.F_WRLCK), "Write"
	if readonly {
		flag, typ, name = os.O_RDONLY, int16(unix.F_RDLCK), "Read"
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, chainErr{"Failed to open disk image " + path, osErrText(err)}
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, chainErr{"Failed to open disk image " + path, osErrText(err)}
	}
	// ByteRange(0, size), as CH's lock_granularity; an empty file locks to
	// EOF (WholeFile).
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: 0, Len: fi.Size()}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		f.Close()
		inner := osErrText(err)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
			inner = "The file is already locked"
		}
		return nil, chainErr{"Error locking disk images: Another instance likely holds a lock",
			"Cannot lock images of all block devices", fmt.Sprintf("Failed to get %s lock for disk image: %s", name, path), inner}
	}
	return f, nil
}

// releaseDisk drops one disk's lock (remove-device: CH drops the block
// device at the request, and the lock with its last fd).
func (v *VMM) releaseDisk(id string) {
	if q := v.qcows[id]; q != nil {
		q.Close() // closes the locked fd too
		delete(v.qcows, id)
		delete(v.disks, id)
		return
	}
	if f := v.disks[id]; f != nil {
		f.Close()
		delete(v.disks, id)
	}
}

func (v *VMM) releaseDisks() {
	for id := range v.disks {
		v.releaseDisk(id)
	}
}

// bootQcow is the first disk's qcow2 image, nil for a raw one.
func (v *VMM) bootQcow(cfg *chapi.VmConfig) *qcow2.Image {
	if len(cfg.Disks) == 0 {
		return nil
	}
	return v.qcows[cfg.Disks[0].ID]
}

// bootDisk is the locked fd of the first disk, through which the guest
// writes (CH writes through the inode it opened; a rename over the path
// would not reach it).
func (v *VMM) bootDisk(cfg *chapi.VmConfig) *os.File {
	if len(cfg.Disks) == 0 {
		return nil
	}
	return v.disks[cfg.Disks[0].ID]
}
