package images

import (
	"context"
	"net/http"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Resolver asks registries which digest a reference names now, by the
// rules the store pulls by: plain HTTP only to loopback and the insecure
// registries, manifests of bounded size, refusals as PullErrors in the
// words kubelet uses. It keeps nothing: kairon-controller pins its pools'
// images with it, and a Store resolves through one, so that a pool never
// pins an image its nodes would refuse to pull.
type Resolver struct {
	insecure  []string
	transport http.RoundTripper
	userAgent string
}

// NewResolver speaks plain HTTP to loopback and to the registries
// (host:port) of insecure, and names itself userAgent.
func NewResolver(insecure []string, userAgent string) *Resolver {
	base, _ := remote.DefaultTransport.(*http.Transport)
	var rt http.RoundTripper = remote.DefaultTransport
	if base != nil {
		t := base.Clone()
		// A registry that accepts the connection and then says nothing
		// fails the request instead of holding the pull forever.
		t.ResponseHeaderTimeout = time.Minute
		rt = t
	}
	return &Resolver{insecure: insecure, transport: &guardedTransport{base: rt, insecure: insecure}, userAgent: userAgent}
}

// Resolve returns the digest (sha256:…) ref names now: a digest
// reference's own, without asking; a tag's from the registry (a HEAD
// request, or a GET when the HEAD's answer has no digest). Every error
// is a *PullError.
func (r *Resolver) Resolve(ctx context.Context, ref string, kc authn.Keychain) (string, error) {
	parsed, err := r.parseReference(ref)
	if err != nil {
		return "", err
	}
	if d, ok := parsed.(name.Digest); ok {
		return d.DigestStr(), nil
	}
	p, err := r.newPuller(parsed, kc)
	if err != nil {
		return "", err
	}
	return p.headDigest(ctx, ref)
}
