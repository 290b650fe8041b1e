package controller

import (
	"context"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/zyvor/kairon/internal/images"
)

// ImageResolver finds the digest of the manifest (or index) an OCI
// reference names now. The pool controller asks it once per template, with
// the credentials of the template's imagePullSecrets.
type ImageResolver interface {
	Resolve(ctx context.Context, ref string, keychain authn.Keychain) (digest string, err error)
}

// RegistryResolver is the ImageResolver that asks the registry, by the
// rules the nodes pull by (images.Resolver): plain HTTP only to loopback
// and InsecureRegistries, manifests of bounded size, refusals in kubelet's
// words (not found, unauthorized) after the reference. A pool thus never
// pins an image its nodes would refuse to fetch.
type RegistryResolver struct {
	// InsecureRegistries (host:port) are spoken to over plain HTTP, as the
	// nodes' --insecure-registry.
	InsecureRegistries []string
}

// Resolve implements ImageResolver.
func (r RegistryResolver) Resolve(ctx context.Context, ref string, keychain authn.Keychain) (string, error) {
	return images.NewResolver(r.InsecureRegistries, "kairon-controller").Resolve(ctx, ref, keychain)
}
