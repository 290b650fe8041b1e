package imagepull

import (
	"context"
	"errors"

	"github.com/zyvor/kairon/internal/images"
)

// StoreOf is the node's image store, internal/images', as a Store: pull
// secrets' docker configs become its keychain.
func StoreOf(s *images.Store) *ImageStore { return &ImageStore{s: s} }

// ImageStore adapts an *images.Store.
type ImageStore struct{ s *images.Store }

// Ensure pulls ref with the credentials of dockerConfigs (none: anonymous).
func (a *ImageStore) Ensure(ctx context.Context, ref string, dockerConfigs [][]byte) (Image, error) {
	kc, err := images.KeychainFromDockerConfigs(dockerConfigs...)
	if err != nil {
		return Image{}, err
	}
	img, err := a.s.Ensure(ctx, ref, kc)
	var pullErr *images.PullError
	if err != nil && !errors.As(err, &pullErr) {
		// Not the image's fault nor the registry's: the node's disk, its
		// converter, a pull cut short. Another attempt may do.
		return Image{}, TransientError{Err: err}
	}
	if err != nil {
		return Image{}, err
	}
	return imageOf(img), nil
}

// Lookup is the cached image of digest (images.Store.Lookup).
func (a *ImageStore) Lookup(digest string) (Image, bool) {
	img, ok := a.s.Lookup(digest)
	if !ok {
		return Image{}, false
	}
	return imageOf(img), true
}

func imageOf(img *images.Image) Image {
	return Image{Reference: img.Reference, Digest: img.Digest, Path: img.Path, Config: img.Config}
}

// GC collects unused images (images.Store.GC).
func (a *ImageStore) GC(inUse func(digest string) bool) ([]string, error) { return a.s.GC(inUse) }
