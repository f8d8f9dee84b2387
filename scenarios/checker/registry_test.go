package checker

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry/remote"

	"github.com/vmchaos/vmchaos/internal/registrytest"
)

// pushArtifact pushes a snapshot artifact of the given files as repo:tag
// with plain oras-go (not the agent's code) and returns the layer digests.
func pushArtifact(t *testing.T, base, repo, tag string, files []string) map[string]digest.Digest {
	t.Helper()
	ctx := context.Background()
	r, err := remote.NewRepository(strings.TrimPrefix(base, "http://") + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	r.PlainHTTP = true
	push := func(mt string, b []byte, ann map[string]string) ocispec.Descriptor {
		d := ocispec.Descriptor{MediaType: mt, Digest: digest.FromBytes(b), Size: int64(len(b)), Annotations: ann}
		if err := r.Push(ctx, d, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	out := map[string]digest.Digest{}
	var layers []ocispec.Descriptor
	for _, f := range files {
		d := push("application/vnd.vmchaos.snapshot.file.v1", []byte("content of "+f), map[string]string{ociTitle: f})
		layers = append(layers, d)
		out[f] = d.Digest
	}
	cfg := push(ociConfigType, []byte(`{"name":"`+repo+`"}`), nil)
	mb, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ociManifestType,
		Config: cfg, Layers: layers, Annotations: map[string]string{ociImageAnnot: "base"}})
	md := ocispec.Descriptor{MediaType: ociManifestType, Digest: digest.FromBytes(mb), Size: int64(len(mb))}
	if err := r.PushReference(ctx, md, bytes.NewReader(mb), tag); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRegistrySnapshotFailsWhenItsDataIsMissing reads artifacts from a real
// distribution server: a whole one passes (and names its image); a missing
// tag, a manifest without a file a wake needs, a deleted blob and a dead
// registry each fail, so "hibernated" is never proven without the data.
func TestRegistrySnapshotFailsWhenItsDataIsMissing(t *testing.T) {
	reg := registrytest.Start(t)
	ctx := context.Background()
	all := []string{"vmctl.json", "config.json", "state.json", "memory-ranges", "disk.img"}
	pushArtifact(t, reg.URL, "vm-a", "hibernate", all)
	var cache digestCache
	snap, err := ReadRegistrySnapshot(ctx, http.DefaultClient, reg.URL, "vm-a", &cache)
	if err != nil {
		t.Fatalf("a whole artifact: %v", err)
	}
	if snap.Image != "base" || len(snap.Files) != len(all) || !strings.HasPrefix(snap.Digest, "sha256:") {
		t.Fatalf("snapshot = %+v", snap)
	}
	pushArtifact(t, reg.URL, "vm-b", "other", all)
	pushArtifact(t, reg.URL, "vm-c", "hibernate", all[:3]) // no disk.img
	blobs := pushArtifact(t, reg.URL, "vm-d", "hibernate", append([]string{"only-in-d"}, all...))
	req, _ := http.NewRequest(http.MethodDelete, reg.URL+"/v2/vm-d/blobs/"+blobs["only-in-d"].String(), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("delete blob: %v %v", resp, err)
	}
	resp.Body.Close()
	for name, want := range map[string]string{"vm-b": `no "hibernate" tag`, "vm-c": "names no disk.img", "vm-d": "404", "vm-x": "tags list"} {
		if _, err := ReadRegistrySnapshot(ctx, http.DefaultClient, reg.URL, name, &digestCache{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want one containing %q", name, err, want)
		}
	}
	reg.Stop()
	if _, err := ReadRegistrySnapshot(ctx, http.DefaultClient, reg.URL, "vm-a", &cache); err == nil {
		t.Errorf("a dead registry proved vm-a hibernated")
	}
}
