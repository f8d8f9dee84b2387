package guestimg

import (
	"fmt"

	"github.com/vmchaos/vmchaos/fakech/qcow2"
)

// DefaultQcow2Size is the virtual size of a fake image written as qcow2.
const DefaultQcow2Size = 64 << 20

// SaveQcow2 writes the image as a new qcow2 v3 file of virtual size bytes:
// the image's bytes from virtual offset 0, the way they would sit on a raw
// disk.
func (img *Image) SaveQcow2(path string, size int64) error {
	b, err := img.Encode()
	if err != nil {
		return fmt.Errorf("guest image %s: %w", path, err)
	}
	if int64(len(b)) > size {
		return fmt.Errorf("guest image %s: %d bytes do not fit a %d-byte disk", path, len(b), size)
	}
	if err := qcow2.Create(path, size, "", ""); err != nil {
		return fmt.Errorf("guest image %s: %w", path, err)
	}
	q, err := qcow2.Open(path, true)
	if err != nil {
		return fmt.Errorf("guest image %s: %w", path, err)
	}
	defer q.Close()
	if _, err := q.WriteAt(b, 0); err != nil {
		return fmt.Errorf("guest image %s: %w", path, err)
	}
	return q.Sync()
}

// ReadDisk returns the bytes a guest sees at the start of the disk file at
// path: the file itself, or for qcow2 everything allocated in its backing
// chain, read through the chain.
func ReadDisk(raw []byte, path string) ([]byte, error) {
	if !qcow2.IsQcow2(raw) {
		return raw, nil
	}
	q, err := qcow2.Open(path, false)
	if err != nil {
		return nil, err
	}
	defer q.Close()
	end, err := q.AllocatedEnd()
	if err != nil {
		return nil, err
	}
	if end > 256<<20 {
		return nil, fmt.Errorf("qcow2 %s: %d bytes allocated: too large for a fake guest image", path, end)
	}
	b := make([]byte, end)
	if _, err := q.ReadAt(b, 0); err != nil {
		return nil, err
	}
	return b, nil
}
