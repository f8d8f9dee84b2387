package lockedbuf

import (
	"io"
	"strings"
	"sync"
	"testing"
)

// Concurrent writers through io.Copy and a reader: -race finds an unlocked
// path, and every byte written is there at the end.
func TestConcurrentCopyAndRead(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := io.Copy(&b, strings.NewReader(strings.Repeat("x", 1000))); err != nil {
				t.Error(err)
			}
		}()
	}
	for i := 0; i < 10; i++ {
		_ = b.String()
	}
	wg.Wait()
	if n := len(b.String()); n != 4000 {
		t.Fatalf("len = %d, want 4000", n)
	}
}
