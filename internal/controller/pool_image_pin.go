package controller

import (
	"fmt"
	"regexp"
	"strings"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// What a pool's members run is its template's image pinned by digest: the
// reference as written, its tag kept for people to read, and the digest
// the pool resolved it to, so that a tag moved later changes nothing in
// the pool until a new template (or `kaironctl rollout restart`) asks the
// registry again.

// sha256Digest is the only digest spec.image can hold (its CRD pattern):
// whatever a registry answers is checked against it before use.
var sha256Digest = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)

// digestOf returns the digest an OCI reference is pinned by, and whether
// it is pinned at all. A digest is what follows the reference's '@'; the
// API server admits only sha256:<64 hex digits> there.
func digestOf(ref string) (string, bool) {
	i := strings.LastIndexByte(ref, '@')
	if i < 0 {
		return "", false
	}
	return ref[i+1:], true
}

// pinImage returns ref pinned by digest: ref@digest, with ref's tag (or
// its lack of one) as written. A ref already pinned is returned as it is,
// provided it is pinned by this digest. The result must still be a valid
// spec.image, which a reference close to the 512-character limit is not
// once the digest is added.
func pinImage(ref, digest string) (string, error) {
	if !sha256Digest.MatchString(digest) {
		return "", fmt.Errorf("digest %q of image %s is not sha256:<64 lowercase hex digits>", truncate(digest, 100), ref)
	}
	if pinned, ok := digestOf(ref); ok {
		if pinned != digest {
			return "", fmt.Errorf("image %s is pinned by %s, not %s", ref, pinned, digest)
		}
		return ref, nil
	}
	pinned := ref + "@" + digest
	if !kaironv1.ValidImage(pinned) {
		if len(pinned) > 512 {
			return "", fmt.Errorf("image %s pinned by digest is %d characters, more than the 512 spec.image may hold", ref, len(pinned))
		}
		return "", fmt.Errorf("image %s pinned by digest, %s, is not a valid spec.image", ref, pinned)
	}
	return pinned, nil
}

// truncate cuts s to at most n bytes, for text that comes from outside
// (a registry's answer) on its way into a status or an event.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
