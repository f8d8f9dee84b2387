package nodeagent

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/errcode"

	"github.com/vmchaos/vmchaos/regress"
)

// The OCI artifact a hibernate push writes (docs/architecture.md §6;
// details in docs/nodeagent.md, "The real registry"): repository <name>, tag hibernate, one layer per snapshot file
// (config, state, memory, disk, vmctl's record) titled by its file name, a
// small config blob and the manifest's annotations naming the image the
// snapshot was taken from.
const (
	ociTag             = "hibernate"
	ociArtifactType    = "application/vnd.vmchaos.snapshot.v1"
	ociConfigMediaType = "application/vnd.vmchaos.snapshot.config.v1+json"
	ociFileMediaType   = "application/vnd.vmchaos.snapshot.file.v1"
	// AnnotationImage names the image (the intent's source snapshot) the
	// hibernate snapshot was taken from: the identity guard reads it.
	AnnotationImage = "io.vmchaos.snapshot.image"
	// AnnotationSnapshotID is the local snapshot id that was pushed.
	AnnotationSnapshotID = "io.vmchaos.snapshot.id"
)

// reasonImageChanged is the failed reason of the image guard's refusal.
const reasonImageChanged = "image_changed"

// ociConfig is the artifact's config blob.
type ociConfig struct {
	Name       string   `json:"name"`
	SnapshotID string   `json:"snapshot_id"`
	Image      string   `json:"image"`
	Files      []string `json:"files"`
}

// ociRepo is the repository of name on the agent's registry. Repository
// names are lower case on a distribution server.
func (a *Agent) ociRepo(name string) (*remote.Repository, error) {
	u, err := url.Parse(a.cfg.RegistryURL)
	if err != nil {
		return nil, fmt.Errorf("registry %s: %w", a.cfg.RegistryURL, err)
	}
	repo, err := remote.NewRepository(u.Host + "/" + strings.ToLower(name))
	if err != nil {
		return nil, fmt.Errorf("registry repository %s: %w", name, err)
	}
	repo.PlainHTTP = u.Scheme == "http"
	repo.Client = a.ociClient()
	return repo, nil
}

// ociClient bounds every request's connect and the wait for its answer by
// --registry-timeout, so an unreachable or frozen registry fails the step
// (and the step retries) instead of hanging the worker.
func (a *Agent) ociClient() *http.Client {
	t := a.cfg.RegistryTimeout
	return &http.Client{Transport: &http.Transport{
		DialContext:           (&net.Dialer{Timeout: t}).DialContext,
		ResponseHeaderTimeout: t,
		DisableKeepAlives:     true, // a restarted registry leaves no stale connection behind
	}}
}

// ociReadManifest fetches name:hibernate. A tag the registry does not know is
// os.ErrNotExist; any other failure (unreachable, frozen) is an error the
// caller must not read as "no snapshot".
func (a *Agent) ociReadManifest(ctx context.Context, name string) (*registryManifest, error) {
	repo, err := a.ociRepo(name)
	if err != nil {
		return nil, err
	}
	desc, rc, err := repo.FetchReference(ctx, ociTag)
	if errors.Is(err, errdef.ErrNotFound) {
		return nil, fmt.Errorf("registry %s:%s: %w", name, ociTag, os.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("registry %s:%s: %w", name, ociTag, err)
	}
	defer rc.Close()
	b, err := content.ReadAll(rc, desc)
	if err != nil {
		return nil, fmt.Errorf("registry %s:%s: manifest: %w", name, ociTag, err)
	}
	var man ocispec.Manifest
	if err := json.Unmarshal(b, &man); err != nil {
		return nil, fmt.Errorf("registry %s:%s: manifest: %w", name, ociTag, err)
	}
	if man.Config.MediaType != ociConfigMediaType || len(man.Layers) == 0 {
		return nil, fmt.Errorf("registry %s:%s: not a vmchaos snapshot artifact (config %s, %d layers)", name, ociTag, man.Config.MediaType, len(man.Layers))
	}
	for _, l := range man.Layers {
		t := l.Annotations[ocispec.AnnotationTitle]
		if t == "" || filepath.Base(t) != t {
			return nil, fmt.Errorf("registry %s:%s: layer %s has no usable title %q", name, ociTag, l.Digest, t)
		}
	}
	return &registryManifest{Name: name, SHA256: desc.Digest.Encoded(), Size: desc.Size,
		SnapshotID: man.Annotations[AnnotationSnapshotID], Image: man.Annotations[AnnotationImage],
		oci: &man, ociDesc: desc}, nil
}

// tarEntry is one snapshot file inside an export archive.
type tarEntry struct {
	name string
	desc ocispec.Descriptor
}

// scanExport digests every file of an export archive (first pass of a push:
// a blob's digest and size must be known before its upload starts).
func scanExport(path string) ([]tarEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var out []tarEntry
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("export archive: %w", err)
		}
		h := sha256.New()
		n, err := io.Copy(h, tr)
		if err != nil {
			return nil, fmt.Errorf("export archive %s: %w", hdr.Name, err)
		}
		out = append(out, tarEntry{name: hdr.Name, desc: ocispec.Descriptor{MediaType: ociFileMediaType,
			Digest: digest.NewDigestFromBytes(digest.SHA256, h.Sum(nil)), Size: n,
			Annotations: map[string]string{ocispec.AnnotationTitle: hdr.Name}}})
	}
}

// ociPush pushes the snapshot (ociPushArtifact). Any failure, a 5xx of a
// registry whose storage is full included, fails the push: the hibernate
// retries it and is never reported done before the commit.
func (a *Agent) ociPush(ctx context.Context, name, snapID, image, archive string) error {
	err := a.ociPushArtifact(ctx, name, snapID, image, archive)
	var er *errcode.ErrorResponse
	if err != nil && errors.As(err, &er) && er.StatusCode >= 500 && regress.On("push-server-error-done") {
		return nil // the historical shortcut: a 5xx taken for a hiccup of a write that landed
	}
	if err != nil && timedOut(err) && regress.On("push-timeout-done") {
		return nil // the historical shortcut: no answer taken for a write that landed
	}
	return err
}

// timedOut reports whether err is a request that got no answer in time (a
// dial or read deadline), as opposed to an answer the registry sent.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// ociPushArtifact uploads the exported archive's files as blobs (a blob the
// registry already has is not sent again: a push retried after a registry
// fault resumes), then the config, then commits the manifest under the
// hibernate tag. The push is done only when that tag put returned: until
// then a reader finds the previous snapshot or none, never a partial one.
func (a *Agent) ociPushArtifact(ctx context.Context, name, snapID, image, archive string) error {
	repo, err := a.ociRepo(name)
	if err != nil {
		return err
	}
	entries, err := scanExport(archive)
	if err != nil {
		return fmt.Errorf("push %s: %w", name, err)
	}
	if err := a.ociPushFiles(ctx, repo, archive, entries); err != nil {
		return fmt.Errorf("push %s: %w", name, err)
	}
	cfg := ociConfig{Name: name, SnapshotID: snapID, Image: image}
	layers := make([]ocispec.Descriptor, 0, len(entries))
	for _, e := range entries {
		cfg.Files = append(cfg.Files, e.name)
		layers = append(layers, e.desc)
	}
	cb, _ := json.Marshal(cfg)
	cdesc := ocispec.Descriptor{MediaType: ociConfigMediaType, Digest: digest.FromBytes(cb), Size: int64(len(cb))}
	if err := pushIfMissing(ctx, repo, cdesc, func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(cb)), nil }); err != nil {
		return fmt.Errorf("push %s: config: %w", name, err)
	}
	if err := hit(ctx, "agent.push.blobs", name, "push"); err != nil {
		return err
	}
	man := ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: cdesc, Layers: layers, Annotations: map[string]string{
			AnnotationImage: image, AnnotationSnapshotID: snapID,
			ocispec.AnnotationCreated: time.Now().UTC().Format(time.RFC3339Nano)}}
	if regress.On("push-done-before-commit") {
		return nil // the historical shortcut: blobs up, manifest never committed
	}
	mb, _ := json.Marshal(man)
	mdesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(mb), Size: int64(len(mb))}
	if err := repo.PushReference(ctx, mdesc, bytes.NewReader(mb), ociTag); err != nil {
		return fmt.Errorf("push %s: commit manifest %s:%s: %w", name, name, ociTag, err)
	}
	return nil
}

// ociPushFiles uploads each archive entry, reading the archive again.
// Each entry's body is limited to the entry: net/http may still read a
// request's body after the response came back (transfer.go reads on
// past ContentLength to report extra bytes, from the connection's write
// goroutine), and read straight from the archive that late read took the
// next entry's bytes, so the next blob went out empty ("ContentLength=455
// with Body length 0": mig-leftover-failed's clean run, 12 cases at once).
func (a *Agent) ociPushFiles(ctx context.Context, repo *remote.Repository, archive string, entries []tarEntry) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for _, e := range entries {
		if _, err := tr.Next(); err != nil {
			return fmt.Errorf("export archive: %w", err)
		}
		body := io.LimitReader(tr, e.desc.Size)
		if err := pushIfMissing(ctx, repo, e.desc, func() (io.ReadCloser, error) { return io.NopCloser(body), nil }); err != nil {
			return fmt.Errorf("blob %s (%s): %w", e.name, e.desc.Digest, err)
		}
	}
	return nil
}

// pushIfMissing uploads one blob unless the registry already has it.
func pushIfMissing(ctx context.Context, repo *remote.Repository, desc ocispec.Descriptor, open func() (io.ReadCloser, error)) error {
	ok, err := repo.Exists(ctx, desc)
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	r, err := open()
	if err != nil {
		return err
	}
	defer r.Close()
	return repo.Push(ctx, desc, r)
}

// ociFetch downloads the artifact m names into an export archive at dst,
// verifying every blob against its digest, so vmctl imports exactly the
// files that were pushed.
func (a *Agent) ociFetch(ctx context.Context, m *registryManifest, dst string) error {
	repo, err := a.ociRepo(m.Name)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, l := range m.oci.Layers {
		if err := fetchLayer(ctx, repo, tw, l); err != nil {
			return fmt.Errorf("pull %s: %w", m.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Sync()
}

func fetchLayer(ctx context.Context, repo *remote.Repository, tw *tar.Writer, l ocispec.Descriptor) error {
	title := l.Annotations[ocispec.AnnotationTitle]
	rc, err := repo.Fetch(ctx, l)
	if err != nil {
		return fmt.Errorf("blob %s (%s): %w", title, l.Digest, err)
	}
	defer rc.Close()
	if err := tw.WriteHeader(&tar.Header{Name: title, Mode: 0o600, Size: l.Size, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	vr := content.NewVerifyReader(rc, l)
	if _, err := io.Copy(tw, vr); err != nil {
		return fmt.Errorf("blob %s (%s): %w", title, l.Digest, err)
	}
	if err := vr.Verify(); err != nil {
		return fmt.Errorf("blob %s (%s): %w", title, l.Digest, err)
	}
	return nil
}

// ociDrop deletes name:hibernate (the manifest; the registry's garbage
// collector owns the blobs). A tag that is already gone is success.
func (a *Agent) ociDrop(ctx context.Context, name string) error {
	repo, err := a.ociRepo(name)
	if err != nil {
		return err
	}
	desc, err := repo.Resolve(ctx, ociTag)
	if errors.Is(err, errdef.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("registry drop %s:%s: %w", name, ociTag, err)
	}
	if err := repo.Delete(ctx, desc); err != nil && !errors.Is(err, errdef.ErrNotFound) {
		return fmt.Errorf("registry drop %s:%s: %w", name, ociTag, err)
	}
	return nil
}

// dropStaging removes the temp archives an earlier push or pull of name
// left when the agent died in it (one worker per name: none is in use).
func (a *Agent) dropStaging(name string) {
	re := regexp.MustCompile(`^\.` + regexp.QuoteMeta(name) + `\.(push|pull)-[0-9]+$`)
	ents, _ := os.ReadDir(a.cfg.RegistryDir)
	for _, e := range ents {
		if re.MatchString(e.Name()) {
			_ = os.Remove(filepath.Join(a.cfg.RegistryDir, e.Name()))
		}
	}
}
