package realch

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The image carries the workload writer: configureGuest installs it
// executable at GuestWriterPath, the cache entry's manifest lists its
// digest, and the build refuses to start without it (no debootstrap here:
// configureGuest only writes files into a root dir).
func TestImageInstallsTheWorkloadWriter(t *testing.T) {
	dir := t.TempDir()
	writer := filepath.Join(dir, "src", ImageWriter)
	content := []byte("\x7fELF a stand-in for the writer binary")
	if err := os.MkdirAll(filepath.Dir(writer), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(writer, content, 0o644); err != nil {
		t.Fatal(err)
	}
	o := ImageOptions{Writer: writer}
	if err := o.findWriter(); err != nil {
		t.Fatal(err)
	}
	key, err := imageKey(o, "idx")
	if err != nil {
		t.Fatal(err)
	}
	// a writer rebuilt while the image builds: the image keeps the bytes
	// its key was made from
	if err := os.WriteFile(writer, []byte("a newer writer"), 0o644); err != nil {
		t.Fatal(err)
	}
	if k, _ := imageKey(o, "idx"); k != key {
		t.Fatal("the key moved with a file changed after it was read")
	}
	root := filepath.Join(dir, "root")
	if err := configureGuest(root, o.writer); err != nil {
		t.Fatal(err)
	}
	installed := filepath.Join(root, GuestWriterPath)
	fi, err := os.Stat(installed)
	if err != nil {
		t.Fatalf("the image has no writer: %v", err)
	}
	if fi.Mode().Perm() != 0o755 {
		t.Fatalf("%s mode %v, want 0755", GuestWriterPath, fi.Mode().Perm())
	}
	if b, _ := os.ReadFile(installed); !bytes.Equal(b, content) {
		t.Fatal("the installed writer differs from the one given")
	}

	// the manifest's file list of a cache entry holds the writer's digest
	entry := filepath.Join(dir, "entry")
	if err := os.MkdirAll(entry, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range imageOutputs {
		if err := os.WriteFile(filepath.Join(entry, n), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeFileMode(filepath.Join(entry, ImageWriter), o.writer, 0o755); err != nil {
		t.Fatal(err)
	}
	files, err := describeOutputs(entry)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	if f := files[ImageWriter]; f.SHA256 != hex.EncodeToString(sum[:]) || f.Bytes != int64(len(content)) {
		t.Fatalf("manifest entry of the writer %+v, want sha256 %x", f, sum)
	}
	// a cache entry that lost its writer is not reused
	b, _ := json.Marshal(ImageInfo{Key: "k", Files: files})
	if err := os.WriteFile(filepath.Join(entry, ImageManifest), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readImageInfo(entry); err != nil {
		t.Fatalf("complete entry: %v", err)
	}
	if err := os.Remove(filepath.Join(entry, ImageWriter)); err != nil {
		t.Fatal(err)
	}
	if _, err := readImageInfo(entry); err == nil || !strings.Contains(err.Error(), ImageWriter) {
		t.Fatalf("an entry without the writer: %v, want it refused", err)
	}

	// no writer: a clear error before anything is fetched or built
	o = ImageOptions{Writer: filepath.Join(dir, "nope", ImageWriter)}
	if err := o.findWriter(); err == nil || !strings.Contains(err.Error(), "make build") || !strings.Contains(err.Error(), "--writer") {
		t.Fatalf("missing writer: %v", err)
	}
	if _, err := imageKey(o, "idx"); err == nil {
		t.Fatal("a key without the writer")
	}
}
