package userimages

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// Result says what Ensure found and did.
type Result struct {
	// Reference is where the image is: registry/repository:tag.
	Reference string
	// Digest is the image's manifest digest there.
	Digest v1.Hash
	// Built: this call built the image (rather than reading the cache).
	Built bool
	// Pushed: the registry lacked this build and got it.
	Pushed bool
}

// Ensure makes sure registry (host[:port][/path]) holds i as
// repository:tag. If the tag there is this very build (the same KeyLabel)
// nothing is built or sent; otherwise the image is built, or read from the
// cache, and pushed. A registry on a loopback or private address is spoken
// to in plain HTTP, any other in HTTPS, with the credentials of `podman
// login` or `docker login` if there are some.
func (i Image) Ensure(ctx context.Context, registry string, o Options) (Result, error) {
	ref, err := name.ParseReference(registry+"/"+i.Name(), name.StrictValidation)
	if err != nil {
		return Result{}, fmt.Errorf("registry %q: %w", registry, err)
	}
	res := Result{Reference: ref.String()}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}
	have, err := registryKey(ref, opts)
	if err != nil {
		return res, err
	}
	if have.key == i.Key() {
		res.Digest = have.digest
		return res, nil
	}
	img, built, err := i.Build(ctx, o)
	if err != nil {
		return res, err
	}
	res.Built = built
	if res.Digest, err = img.Digest(); err != nil {
		return res, err
	}
	began := time.Now()
	o.progress("pushing %s to %s ...", i.Name(), registry)
	if err := remote.Write(ref, img, opts...); err != nil {
		return res, fmt.Errorf("pushing %s: %w", ref, err)
	}
	o.progress("pushed %s@%s in %s", ref, res.Digest, time.Since(began).Round(100*time.Millisecond))
	res.Pushed = true
	return res, nil
}

type registryImage struct {
	key    string // "" if the tag is missing or carries no key
	digest v1.Hash
}

// registryKey reads the KeyLabel of the image ref names in its registry.
func registryKey(ref name.Reference, opts []remote.Option) (registryImage, error) {
	desc, err := remote.Get(ref, opts...)
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return registryImage{}, nil
	}
	if err != nil {
		return registryImage{}, fmt.Errorf("asking the registry for %s: %w", ref, err)
	}
	img, err := desc.Image()
	if err != nil {
		// An index or another kind of manifest: not a build of ours.
		return registryImage{digest: desc.Digest}, nil
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return registryImage{}, fmt.Errorf("reading %s's config: %w", ref, err)
	}
	return registryImage{key: cf.Config.Labels[KeyLabel], digest: desc.Digest}, nil
}
