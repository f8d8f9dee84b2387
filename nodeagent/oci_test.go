package nodeagent

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"oras.land/oras-go/v2/content"

	"github.com/vmchaos/vmchaos/internal/registrytest"
)

// snapshotArchive writes an export-shaped tar (vmctl's snapshot files) and
// returns its path and contents.
func snapshotArchive(t *testing.T, dir string) (string, map[string]string) {
	t.Helper()
	files := map[string]string{"vmctl.json": `{"name":"vm-a"}`, "config.json": "{}", "state.json": `{"s":1}`,
		"memory-ranges": strings.Repeat("m", 70000), "disk.img": strings.Repeat("d", 3000)}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, n := range []string{"vmctl.json", "config.json", "state.json", "memory-ranges", "disk.img"} {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o600, Size: int64(len(files[n])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(files[n])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "export.tar")
	if err := os.WriteFile(p, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p, files
}

func readArchive(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = string(b)
	}
}

func ociAgent(t *testing.T, url string) *Agent {
	return &Agent{cfg: Config{RegistryURL: url, RegistryDir: t.TempDir(), RegistryTimeout: 5 * time.Second}}
}

// TestOCIPushCommitsTagAndWakePullsTheSameFiles pushes an export to a real
// distribution server: the manifest under <name>:hibernate names the image
// and snapshot id, the pull rebuilds an archive with exactly the pushed
// files, and the drop removes the tag (a second drop is a no-op).
func TestOCIPushCommitsTagAndWakePullsTheSameFiles(t *testing.T) {
	reg := registrytest.Start(t)
	a := ociAgent(t, reg.URL)
	ctx := context.Background()
	if err := a.registryHas(ctx, "vm-a"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("before the push: registryHas = %v, want ErrNotExist", err)
	}
	archive, files := snapshotArchive(t, t.TempDir())
	if err := a.ociPush(ctx, "vm-a", "SNAP1", "base", archive); err != nil {
		t.Fatal(err)
	}
	m, err := a.readManifest(ctx, "vm-a")
	if err != nil {
		t.Fatal(err)
	}
	if m.Image != "base" || m.SnapshotID != "SNAP1" || len(m.oci.Layers) != len(files) {
		t.Fatalf("manifest: image %q snapshot %q, %d layers", m.Image, m.SnapshotID, len(m.oci.Layers))
	}
	dst := filepath.Join(t.TempDir(), "pulled.tar")
	if err := a.ociFetch(ctx, m, dst); err != nil {
		t.Fatal(err)
	}
	got := readArchive(t, dst)
	if len(got) != len(files) {
		t.Fatalf("pulled %d files, pushed %d", len(got), len(files))
	}
	for n, want := range files {
		if got[n] != want {
			t.Errorf("pulled %s: %d bytes, pushed %d", n, len(got[n]), len(want))
		}
	}
	// a push again (a retried hibernate) finds its blobs and commits again
	if err := a.ociPush(ctx, "vm-a", "SNAP2", "base", archive); err != nil {
		t.Fatal(err)
	}
	if m, err := a.readManifest(ctx, "vm-a"); err != nil || m.SnapshotID != "SNAP2" {
		t.Fatalf("after the second push: %+v, %v", m, err)
	}
	for i := 0; i < 2; i++ {
		if err := a.dropRegistry(ctx, "vm-a"); err != nil {
			t.Fatalf("drop %d: %v", i, err)
		}
	}
	if err := a.registryHas(ctx, "vm-a"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after the drop: registryHas = %v, want ErrNotExist", err)
	}
}

// TestOCIUnreachableRegistryIsNotNoSnapshot: a registry that does not answer
// is an error, never "no snapshot", so the evidence lookup fails closed.
func TestOCIUnreachableRegistryIsNotNoSnapshot(t *testing.T) {
	reg := registrytest.Start(t)
	a := ociAgent(t, reg.URL)
	reg.Stop()
	err := a.registryHas(context.Background(), "vm-a")
	if err == nil || errors.Is(err, os.ErrNotExist) {
		t.Fatalf("registryHas on a dead registry = %v, want an error that is not ErrNotExist", err)
	}
}

// TestImageGuardRefusesAnotherImage: a snapshot restores only into the image
// it was taken from; the refusal carries reason image_changed.
func TestImageGuardRefusesAnotherImage(t *testing.T) {
	rec := func(img string) *record { return &record{Name: "vm-a", Intent: Intent{Snapshot: img}} }
	for _, tc := range []struct {
		name   string
		intent string
		m      *registryManifest
		refuse bool
	}{
		{"no snapshot", "base", nil, false},
		{"same image", "base", &registryManifest{Image: "base"}, false},
		{"pushed before images were recorded", "base-v2", &registryManifest{}, false},
		{"changed image", "base-v2", &registryManifest{Image: "base"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := imageGuard(rec(tc.intent), tc.m)
			if (err != nil) != tc.refuse {
				t.Fatalf("imageGuard = %v, refuse %v", err, tc.refuse)
			}
			var oe *opError
			if tc.refuse && (!errors.Is(err, ErrImageChanged) || !errors.As(err, &oe) || oe.reason != reasonImageChanged) {
				t.Fatalf("refusal %v: want ErrImageChanged with reason %s", err, reasonImageChanged)
			}
		})
	}
}

func TestValidateRegistryURL(t *testing.T) {
	base := DefaultConfig()
	base.StateDir, base.RegistryDir, base.VMCtl = "/s", "/r", "vmctl"
	for url, ok := range map[string]bool{"": true, "http://127.0.0.1:5000": true, "https://reg:443": true,
		"127.0.0.1:5000": false, "ftp://x": false, "http://127.0.0.1:5000/v2": false} {
		c := base
		c.RegistryURL = url
		if err := c.Validate(); (err == nil) != ok {
			t.Errorf("Validate(--registry %q) = %v, want ok %v", url, err, ok)
		}
	}
}

// TestOCIPushServerErrorFailsThePush: a manifest commit the registry
// answers with a 500 (what the distribution server answers when its storage
// is full: ENOSPC) fails the push, so the hibernate is never reported done,
// and no tag is committed; the same push succeeds once the registry takes
// writes again. (The switch push-server-error-done takes that 500 as done:
// the scenarios reg-*-registry-storage-full catch it.)
func TestOCIPushServerErrorFailsThePush(t *testing.T) {
	reg := registrytest.Start(t)
	target, err := url.Parse(reg.URL)
	if err != nil {
		t.Fatal(err)
	}
	var full atomic.Bool
	full.Store(true)
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if full.Load() && r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/manifests/") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"errors":[{"code":"UNKNOWN","message":"unknown error","detail":{"DriverName":"filesystem","Enclosed":{"Op":"write","Err":28}}}]}`)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	a := ociAgent(t, srv.URL)
	ctx := context.Background()
	archive, _ := snapshotArchive(t, t.TempDir())
	err = a.ociPush(ctx, "vm-a", "SNAP1", "base", archive)
	if err == nil || !strings.Contains(err.Error(), "commit manifest") || !strings.Contains(err.Error(), "500") {
		t.Fatalf("push against a full registry: %v, want the commit's 500", err)
	}
	if err := a.registryHas(ctx, "vm-a"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after the failed push: registryHas = %v, want ErrNotExist (no tag)", err)
	}
	full.Store(false)
	if err := a.ociPush(ctx, "vm-a", "SNAP1", "base", archive); err != nil {
		t.Fatalf("push after the heal: %v", err)
	}
	if m, err := a.readManifest(ctx, "vm-a"); err != nil || m.SnapshotID != "SNAP1" {
		t.Fatalf("after the healed push: %+v, %v", m, err)
	}
}

// TestTimedOutTellsNoAnswerFromAnAnswer: what the push-timeout-done switch
// takes for done is a request that got no answer in time (a dial or read
// deadline, wrapped as the HTTP client wraps it), never an answer the
// registry sent or another failure.
func TestTimedOutTellsNoAnswerFromAnAnswer(t *testing.T) {
	dialTimeout := &url.Error{Op: "Put", URL: "http://10.77.0.2:5000/v2/", Err: os.ErrDeadlineExceeded}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{dialTimeout, true},
		{errors.Join(errors.New("push vm-a: commit manifest"), dialTimeout), true},
		{errors.New("500 Internal Server Error"), false},
		{&url.Error{Op: "Put", URL: "http://x/", Err: errors.New("connection refused")}, false},
		{context.Canceled, false},
	} {
		if got := timedOut(c.err); got != c.want {
			t.Errorf("timedOut(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// lateBodyTransport forwards requests to base, and reads each request's
// body once more after its response came back, at the next request, as
// net/http's own transport may (it reads on past ContentLength from the
// connection's write goroutine to report extra bytes, and closes the body
// then): the http.RoundTripper contract lets the transport use the body
// until it closed it.
type lateBodyTransport struct {
	base http.RoundTripper
	mu   sync.Mutex
	prev io.ReadCloser // the last request's body, read on and closed at the next request
}

func (l *lateBodyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	l.mu.Lock()
	if l.prev != nil {
		_, _ = io.Copy(io.Discard, l.prev)
		l.prev.Close()
		l.prev = nil
	}
	l.mu.Unlock()
	if req.Body == nil || req.Body == http.NoBody {
		return l.base.RoundTrip(req)
	}
	buf := make([]byte, req.ContentLength)
	if n, err := io.ReadFull(req.Body, buf); err != nil {
		req.Body.Close()
		return nil, fmt.Errorf("%s %s: body %d of ContentLength %d bytes: %w", req.Method, req.URL.Path, n, req.ContentLength, err)
	}
	l.mu.Lock()
	l.prev = req.Body
	l.mu.Unlock()
	out := req.Clone(req.Context())
	out.Body, out.GetBody = io.NopCloser(bytes.NewReader(buf)), nil
	return l.base.RoundTrip(out)
}

// TestOCIPushFilesBodiesEndAtTheirEntry: a transport that reads a body on
// after the response (as net/http may) must not take the next archive
// entry's bytes: every blob arrives whole and the pull gets the files back.
// Read straight from the archive, the second blob went out empty.
func TestOCIPushFilesBodiesEndAtTheirEntry(t *testing.T) {
	reg := registrytest.Start(t)
	a := ociAgent(t, reg.URL)
	ctx := context.Background()
	archive, files := snapshotArchive(t, t.TempDir())
	entries, err := scanExport(archive)
	if err != nil {
		t.Fatal(err)
	}
	repo, err := a.ociRepo("vm-a")
	if err != nil {
		t.Fatal(err)
	}
	repo.Client = &http.Client{Transport: &lateBodyTransport{base: &http.Transport{DisableKeepAlives: true}}}
	if err := a.ociPushFiles(ctx, repo, archive, entries); err != nil {
		t.Fatalf("push with a late body reader: %v", err)
	}
	plain, err := a.ociRepo("vm-a")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := content.FetchAll(ctx, plain, e.desc)
		if err != nil || string(b) != files[e.name] {
			t.Fatalf("blob %s: %d bytes, %v; want the %d bytes pushed", e.name, len(b), err, len(files[e.name]))
		}
	}
}
