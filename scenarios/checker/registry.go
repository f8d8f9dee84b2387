package checker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Invariants of the real-registry cases, judged by the runner's refusal
// steps (runner/registry.go) while the refusal is in force.
const (
	// ImageGuard: a hibernate snapshot is restored only into the image it
	// was taken from; a changed image is refused with reason image_changed.
	ImageGuard = "image-guard"
	// FailClosed: while the hibernate evidence cannot be read (the registry
	// unreachable) the agent refuses a fresh boot until its retry budget is
	// spent, and no VM of the name appears.
	FailClosed = "fail-closed"
)

// The checker reads a real registry the way any client would, over its
// /v2/ HTTP API (the distribution spec), without the agent's code: the
// tags list must hold "hibernate", the manifest under that tag must be a
// snapshot artifact naming the files a wake needs, and every blob it names
// must be served whole at its digest.
const (
	ociTag           = "hibernate"
	ociManifestType  = "application/vnd.oci.image.manifest.v1+json"
	ociConfigType    = "application/vnd.vmchaos.snapshot.config.v1+json"
	ociTitle         = "org.opencontainers.image.title"
	ociImageAnnot    = "io.vmchaos.snapshot.image"
	registryDeadline = 10 * time.Second
)

// ociWakeFiles are the files an import cannot do without (vmctl's
// readArchive): a manifest missing one is not a snapshot a wake can use.
var ociWakeFiles = []string{"vmctl.json", "config.json", "state.json", "disk.img"}

type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type ociManifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	Config        ociDescriptor     `json:"config"`
	Layers        []ociDescriptor   `json:"layers"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// RegistrySnapshot is what the registry holds under name:hibernate.
type RegistrySnapshot struct {
	Digest string // the manifest's digest
	Image  string // the image annotation (the intent's source when pushed)
	Files  []string
}

// ReadRegistrySnapshot reads and verifies name:hibernate on the registry at
// base ("http://host:port"). Every blob's content is hashed once per digest
// (cache), later polls only ask that it is still served.
func ReadRegistrySnapshot(ctx context.Context, cl *http.Client, base, name string, cache *digestCache) (*RegistrySnapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, registryDeadline)
	defer cancel()
	repo := base + "/v2/" + strings.ToLower(name)
	var tags struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if err := registryJSON(ctx, cl, repo+"/tags/list", "", &tags, nil); err != nil {
		return nil, fmt.Errorf("tags list: %w", err)
	}
	if !slices.Contains(tags.Tags, ociTag) {
		return nil, fmt.Errorf("tags list of %s has no %q tag (tags %v)", name, ociTag, tags.Tags)
	}
	var man ociManifest
	var hdr http.Header
	if err := registryJSON(ctx, cl, repo+"/manifests/"+ociTag, ociManifestType, &man, &hdr); err != nil {
		return nil, fmt.Errorf("manifest %s:%s: %w", name, ociTag, err)
	}
	if man.SchemaVersion != 2 || man.Config.MediaType != ociConfigType {
		return nil, fmt.Errorf("manifest %s:%s: not a snapshot artifact (schema %d, config %q)", name, ociTag, man.SchemaVersion, man.Config.MediaType)
	}
	snap := &RegistrySnapshot{Digest: hdr.Get("Docker-Content-Digest"), Image: man.Annotations[ociImageAnnot]}
	for _, l := range append([]ociDescriptor{man.Config}, man.Layers...) {
		if err := verifyBlob(ctx, cl, repo, l, cache); err != nil {
			return nil, fmt.Errorf("manifest %s:%s: %w", name, ociTag, err)
		}
		if t := l.Annotations[ociTitle]; t != "" {
			snap.Files = append(snap.Files, t)
		}
	}
	for _, f := range ociWakeFiles {
		if !slices.Contains(snap.Files, f) {
			return nil, fmt.Errorf("manifest %s:%s names no %s layer (files %v)", name, ociTag, f, snap.Files)
		}
	}
	return snap, nil
}

// registryJSON GETs url and decodes a 200 answer; anything else is an error
// that carries the registry's own error body.
func registryJSON(ctx context.Context, cl *http.Client, url, accept string, out any, hdr *http.Header) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := cl.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %.200s", url, resp.Status, strings.TrimSpace(string(b)))
	}
	if hdr != nil {
		*hdr = resp.Header
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}

// verifyBlob asks that d is served at its size (HEAD) and, the first time
// its digest is seen, that its content hashes to it.
func verifyBlob(ctx context.Context, cl *http.Client, repo string, d ociDescriptor, cache *digestCache) error {
	url := repo + "/blobs/" + d.Digest
	alg, want, ok := strings.Cut(d.Digest, ":")
	if !ok || alg != "sha256" || len(want) != 64 {
		return fmt.Errorf("blob %q: not a sha256 digest", d.Digest)
	}
	key := "oci/" + d.Digest
	cache.mu.Lock()
	done := cache.ok[key] != ""
	cache.mu.Unlock()
	method := http.MethodGet
	if done {
		method = http.MethodHead
	}
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return err
	}
	resp, err := cl.Do(req)
	if err != nil {
		return fmt.Errorf("blob %s: %w", d.Digest, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("blob %s (%s): %s %s", d.Digest, d.Annotations[ociTitle], method, resp.Status)
	}
	if resp.ContentLength != d.Size {
		return fmt.Errorf("blob %s: %d bytes served, manifest says %d", d.Digest, resp.ContentLength, d.Size)
	}
	if done {
		return nil
	}
	h := sha256.New()
	if _, err := io.Copy(h, resp.Body); err != nil {
		return fmt.Errorf("blob %s: read: %w", d.Digest, err)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != want {
		return fmt.Errorf("blob %s: content hashes to sha256:%s", d.Digest, sum)
	}
	cache.mu.Lock()
	if cache.ok == nil {
		cache.ok = map[string]string{}
	}
	cache.ok[key] = d.Digest
	cache.mu.Unlock()
	return nil
}
