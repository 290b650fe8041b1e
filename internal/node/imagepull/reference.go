package imagepull

import (
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// Pinned is image pinned to digest: the reference a node pulls for a
// Machine that already ran digest (a migration, a restore, a restart), so
// that it gets the very image, whatever the tag says now. An image already
// pinned keeps its own digest: spec.image is what the user asked for, and
// a digest there cannot move. An empty digest leaves image as it is.
func Pinned(image, digest string) (string, error) {
	if digest == "" || strings.Contains(image, "@") {
		return image, nil
	}
	ref, err := name.ParseReference(image)
	if err != nil {
		return "", fmt.Errorf("spec.image %q: %w", image, err)
	}
	pinned := image + "@" + digest
	if _, err := name.NewDigest(pinned); err != nil {
		return "", fmt.Errorf("spec.image %q with digest %q: %w", ref.String(), digest, err)
	}
	return pinned, nil
}

// DigestOf is the digest a pinned reference names, or "".
func DigestOf(image string) string {
	if i := strings.LastIndexByte(image, '@'); i >= 0 {
		return image[i+1:]
	}
	return ""
}
