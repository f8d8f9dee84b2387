// Package lockedbuf is a byte buffer a process's output is copied into
// while another goroutine reads it.
package lockedbuf

import (
	"bytes"
	"sync"
)

// Buffer is a locked buffer. It does not embed bytes.Buffer: io.Copy would
// find its ReadFrom and write around the lock.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
