package v1alpha1

import (
	"regexp"
	"strings"
)

// OCIImageReferencePattern is the syntax of an OCI image reference in
// spec.image: registry[:port]/repository[:tag][@sha256:<64 hex digits>].
// The registry part is required (a host with a dot or a port, or
// localhost), so that a reference never depends on a default registry.
// The CRD's validation rule on spec.image holds the same pattern
// (image_reference_test.go checks that they agree).
const OCIImageReferencePattern = `^(localhost(:[0-9]+)?|[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?([.][a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)+(:[0-9]+)?|[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?:[0-9]+)(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)+(:[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$`

// BuiltinImagePattern is the syntax of a built-in guest image's name.
const BuiltinImagePattern = `^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`

// DefaultImage is the built-in guest a Machine runs without spec.image.
const DefaultImage = "default"

var (
	ociImageReference = regexp.MustCompile(OCIImageReferencePattern)
	builtinImage      = regexp.MustCompile(BuiltinImagePattern)
)

// IsOCIImage reports whether spec.image names an OCI image rather than a
// built-in guest image: only OCI references contain a slash.
func IsOCIImage(image string) bool { return strings.Contains(image, "/") }

// ValidImage reports whether image is a valid spec.image: a built-in name
// or an OCI reference.
func ValidImage(image string) bool {
	if IsOCIImage(image) {
		return len(image) <= 512 && ociImageReference.MatchString(image)
	}
	return builtinImage.MatchString(image)
}
