package images

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Bounds on what a registry sends before a layer: a registry is as
// untrusted as the image. containerd takes manifests of up to 4 MiB too.
const (
	maxManifestBytes = 4 << 20
	maxConfigBytes   = 8 << 20
	maxLayers        = 127 // what Docker and overlayfs allow
	// Platform is the only platform Kairon's guests run.
	platformOS   = "linux"
	platformArch = "amd64"
)

// registryRetry retries a registry's 5xx and dropped connections twice,
// quickly: the caller retries a RegistryUnavailable image itself, later.
var registryRetry = remote.Backoff{Duration: 250 * time.Millisecond, Factor: 3, Jitter: 0.1, Steps: 3}

// parseReference parses an image reference as spec.image holds it. The
// registry must be named (a host with a dot or a port, or localhost):
// the store never falls back to a default registry.
func (r *Resolver) parseReference(ref string) (name.Reference, error) {
	host, _, _ := strings.Cut(ref, "/")
	if !strings.Contains(ref, "/") || !(strings.ContainsAny(host, ".:") || host == "localhost") {
		return nil, pullErrorf(ref, ReasonInvalidImage, "the reference does not name a registry (registry[:port]/repository[:tag][@sha256:…])")
	}
	var opts []name.Option
	if slices.Contains(r.insecure, host) {
		opts = append(opts, name.Insecure)
	}
	parsed, err := name.ParseReference(ref, opts...)
	if err != nil {
		return nil, pullErrorf(ref, ReasonInvalidImage, "not a valid reference: %v", err)
	}
	return parsed, nil
}

// puller is a registry session for one reference and keychain.
type puller struct {
	p         *remote.Puller
	ref       name.Reference
	anonymous bool // no credentials for ref's repository
}

func (r *Resolver) newPuller(ref name.Reference, kc authn.Keychain) (*puller, error) {
	if kc == nil {
		kc = authn.NewMultiKeychain()
	}
	anonymous := false
	if a, err := kc.Resolve(ref.Context()); err == nil && a == authn.Anonymous {
		anonymous = true
	}
	p, err := remote.NewPuller(
		remote.WithAuthFromKeychain(kc),
		remote.WithTransport(r.transport),
		remote.WithRetryBackoff(registryRetry),
		remote.WithUserAgent(r.userAgent),
	)
	if err != nil {
		return nil, err
	}
	return &puller{p: p, ref: ref, anonymous: anonymous}, nil
}

// resolved is what a reference names: the digest it resolved to (an
// index's or a manifest's) and, for linux/amd64, the image manifest.
type resolved struct {
	digest         string // what the reference resolved to
	manifestDigest string // the linux/amd64 image manifest's
	manifest       *v1.Manifest
}

// manifestJSON is what the store reads of a manifest or index to tell them
// apart: the media type field, or the fields only one of them has.
type manifestJSON struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     types.MediaType   `json:"mediaType"`
	Manifests     []json.RawMessage `json:"manifests"`
	Config        json.RawMessage   `json:"config"`
}

// resolve fetches what ref names and, from an index, the linux/amd64
// image manifest.
func (p *puller) resolve(ctx context.Context, refStr string) (*resolved, error) {
	desc, err := p.p.Get(ctx, p.ref)
	if err != nil {
		return nil, classify(refStr, err, p.anonymous)
	}
	if d, ok := p.ref.(name.Digest); ok && desc.Digest.String() != d.DigestStr() {
		return nil, pullErrorf(refStr, ReasonInvalidImage, "the registry sent a manifest of digest %s for %s", desc.Digest, d.DigestStr())
	}
	r := &resolved{digest: desc.Digest.String()}
	kind, err := manifestKind(desc.Manifest, desc.MediaType)
	if err != nil {
		return nil, pullErrorf(refStr, ReasonInvalidImage, "%v", err)
	}
	body := desc.Manifest
	if kind == "index" {
		idx, err := v1.ParseIndexManifest(bytes.NewReader(body))
		if err != nil {
			return nil, pullErrorf(refStr, ReasonInvalidImage, "the image index: %v", err)
		}
		child, err := pickPlatform(idx)
		if err != nil {
			return nil, &PullError{Reference: refStr, Reason: ReasonWrongPlatform, Err: err}
		}
		cdesc, err := p.p.Get(ctx, p.ref.Context().Digest(child.Digest.String()))
		if err != nil {
			return nil, classify(refStr, err, p.anonymous)
		}
		if cdesc.Digest != child.Digest {
			return nil, pullErrorf(refStr, ReasonInvalidImage, "the registry sent a manifest of digest %s for %s", cdesc.Digest, child.Digest)
		}
		if k, err := manifestKind(cdesc.Manifest, cdesc.MediaType); err != nil || k != "image" {
			return nil, pullErrorf(refStr, ReasonInvalidImage, "the index's linux/amd64 entry %s is not an image manifest", child.Digest)
		}
		body = cdesc.Manifest
		r.manifestDigest = child.Digest.String()
	} else {
		r.manifestDigest = r.digest
	}
	m, err := v1.ParseManifest(bytes.NewReader(body))
	if err != nil {
		return nil, pullErrorf(refStr, ReasonInvalidImage, "the image manifest: %v", err)
	}
	if err := checkManifest(m); err != nil {
		return nil, pullErrorf(refStr, ReasonInvalidImage, "the image manifest: %v", err)
	}
	r.manifest = m
	return r, nil
}

// manifestKind tells an image manifest ("image") from an index ("index"),
// by the manifest's own media type, then the registry's Content-Type, then
// its fields; Docker's schema 1 and anything else are refused.
func manifestKind(body []byte, contentType types.MediaType) (string, error) {
	var m manifestJSON
	if err := json.Unmarshal(body, &m); err != nil {
		return "", fmt.Errorf("the manifest is not JSON: %v", err)
	}
	if m.SchemaVersion == 1 {
		return "", errors.New("schema 1 manifests (Docker's oldest format) are not supported; push the image again with a current tool")
	}
	mt := m.MediaType
	if mt == "" {
		mt = contentType
	}
	switch mt {
	case types.OCIImageIndex, types.DockerManifestList:
		return "index", nil
	case types.OCIManifestSchema1, types.DockerManifestSchema2:
		return "image", nil
	}
	switch {
	case m.Manifests != nil:
		return "index", nil
	case m.Config != nil:
		return "image", nil
	}
	return "", fmt.Errorf("unsupported manifest media type %q", mt)
}

// pickPlatform finds the linux/amd64 image of an index, or says which
// platforms it has instead.
func pickPlatform(idx *v1.IndexManifest) (v1.Descriptor, error) {
	var have []string
	for _, d := range idx.Manifests {
		if d.Platform == nil {
			continue
		}
		if d.Platform.OS == platformOS && d.Platform.Architecture == platformArch {
			return d, nil
		}
		if d.Platform.OS == "unknown" {
			continue // an attestation, not an image
		}
		p := d.Platform.OS + "/" + d.Platform.Architecture
		if d.Platform.Variant != "" {
			p += "/" + d.Platform.Variant
		}
		if !slices.Contains(have, p) {
			have = append(have, p)
		}
	}
	sort.Strings(have)
	if len(have) == 0 {
		return v1.Descriptor{}, errors.New("the image index lists no linux/amd64 image, and Kairon runs linux/amd64 images only")
	}
	return v1.Descriptor{}, fmt.Errorf("it is built for %s, and Kairon runs linux/amd64 images only", strings.Join(have, ", "))
}

// checkManifest checks an image manifest's descriptors before anything is
// downloaded: how many layers, what they are, sizes that make sense.
func checkManifest(m *v1.Manifest) error {
	if len(m.Layers) > maxLayers {
		return fmt.Errorf("%d layers, more than %d", len(m.Layers), maxLayers)
	}
	if m.Config.Size < 0 || m.Config.Size > maxConfigBytes {
		return fmt.Errorf("a config of %d bytes (at most %d)", m.Config.Size, maxConfigBytes)
	}
	switch m.Config.MediaType {
	case types.OCIConfigJSON, types.DockerConfigJSON:
	default:
		return fmt.Errorf("it is not a container image: its config is %q", m.Config.MediaType)
	}
	if m.Config.Digest.Algorithm != "sha256" {
		return fmt.Errorf("config digest %q is not sha256", m.Config.Digest)
	}
	for i, l := range m.Layers {
		if l.Size < 0 {
			return fmt.Errorf("layer %d: negative size", i+1)
		}
		if l.Digest.Algorithm != "sha256" {
			return fmt.Errorf("layer %d: digest %q is not sha256", i+1, l.Digest)
		}
		switch l.MediaType {
		case types.OCILayer, types.OCILayerZStd, types.OCIUncompressedLayer, types.DockerLayer, types.DockerUncompressedLayer:
		case types.DockerForeignLayer, types.OCIRestrictedLayer, types.OCIUncompressedRestrictedLayer:
			return fmt.Errorf("layer %d is a foreign (non-distributable) layer, which is not supported", i+1)
		default:
			return fmt.Errorf("layer %d: unsupported media type %q", i+1, l.MediaType)
		}
	}
	return nil
}

// fetchBlob copies the blob of digest d (size bytes, from the manifest)
// to w and checks both: a registry that sends other bytes is refused.
func (p *puller) fetchBlob(ctx context.Context, refStr string, what string, d v1.Hash, size int64, w io.Writer) error {
	l, err := p.p.Layer(ctx, p.ref.Context().Digest(d.String()))
	if err != nil {
		return classify(refStr, err, p.anonymous)
	}
	rc, err := l.Compressed()
	if err != nil {
		return classify(refStr, err, p.anonymous)
	}
	defer rc.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), io.LimitReader(rc, size+1))
	var outErr errOutput
	if errors.As(err, &outErr) {
		return err
	}
	got := "sha256:" + hex.EncodeToString(h.Sum(nil))
	switch {
	case n > size:
		return pullErrorf(refStr, ReasonInvalidImage, "%s %s: the registry sent more than the %d bytes the manifest says", what, d, size)
	case n == size && got != d.String():
		// ggcr's own check may have failed the read first: whatever the
		// error, bytes that do not match their digest are the verdict.
		return pullErrorf(refStr, ReasonInvalidImage, "%s %s: the registry sent content whose digest is %s", what, d, got)
	case err != nil:
		return classify(refStr, err, p.anonymous)
	case n < size:
		return pullErrorf(refStr, ReasonRegistryUnavailable, "%s %s: the registry sent %d of its %d bytes", what, d, n, size)
	}
	return nil
}

// headDigest is Resolve's registry part: the digest ref names, from a HEAD
// request, or a GET when the registry's HEAD answer has none.
func (p *puller) headDigest(ctx context.Context, refStr string) (string, error) {
	desc, err := p.p.Head(ctx, p.ref)
	if err == nil {
		return desc.Digest.String(), nil
	}
	if perr := classify(refStr, err, p.anonymous); perr.Reason != ReasonRegistryUnavailable {
		return "", perr
	}
	full, gerr := p.p.Get(ctx, p.ref)
	if gerr != nil {
		return "", classify(refStr, gerr, p.anonymous)
	}
	return full.Digest.String(), nil
}

// guardedTransport is the store's HTTP transport. It speaks plain HTTP
// only to loopback and the registries the node lists as insecure
// (go-containerregistry would also to any private address), and it cuts
// off a manifest longer than maxManifestBytes.
type guardedTransport struct {
	base     http.RoundTripper
	insecure []string
}

var (
	errPlainHTTP        = errors.New("plain HTTP is allowed only to loopback and the node's insecure registries")
	errManifestTooLarge = fmt.Errorf("the registry sent a manifest longer than %d bytes", maxManifestBytes)
)

func (g *guardedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !g.allowsHTTP(req.URL.Host) {
		return nil, fmt.Errorf("http://%s: %w", req.URL.Host, errPlainHTTP)
	}
	resp, err := g.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if strings.Contains(req.URL.Path, "/manifests/") {
		resp.Body = &limitedBody{rc: resp.Body, left: maxManifestBytes}
	}
	return resp, nil
}

func (g *guardedTransport) allowsHTTP(hostport string) bool {
	if slices.Contains(g.insecure, hostport) {
		return true
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// limitedBody fails a read past its limit instead of truncating silently.
type limitedBody struct {
	rc   io.ReadCloser
	left int64
}

func (l *limitedBody) Read(p []byte) (int, error) {
	if l.left <= 0 {
		var one [1]byte
		if n, err := l.rc.Read(one[:]); n == 0 && err != nil {
			return 0, err
		}
		return 0, errManifestTooLarge
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.rc.Read(p)
	l.left -= int64(n)
	return n, err
}

func (l *limitedBody) Close() error { return l.rc.Close() }
