package images

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// Reason is why an image cannot be pulled or used: what a Machine's
// message and the node's Failed event report.
type Reason string

const (
	// ReasonNotFound: the registry has no such repository, tag or digest.
	ReasonNotFound Reason = "NotFound"
	// ReasonUnauthorized: the registry refused the credentials, or wants
	// some and none were given.
	ReasonUnauthorized Reason = "Unauthorized"
	// ReasonTooLarge: the image is above the node's compressed or
	// uncompressed size limit, or has more files than it takes.
	ReasonTooLarge Reason = "TooLarge"
	// ReasonWrongPlatform: the image is not built for linux/amd64.
	ReasonWrongPlatform Reason = "WrongPlatform"
	// ReasonInvalidImage: the reference, a manifest, config or layer is
	// malformed, does not match its digest, or holds something a Machine
	// may not boot (a device node, a path leaving the image's root).
	ReasonInvalidImage Reason = "InvalidImage"
	// ReasonRegistryUnavailable: the registry could not be reached or
	// failed (network down, 5xx, rate limited); trying again may work.
	ReasonRegistryUnavailable Reason = "RegistryUnavailable"
)

// words is how a reason reads in a message.
var words = map[Reason]string{
	ReasonNotFound:            "not found",
	ReasonUnauthorized:        "unauthorized",
	ReasonTooLarge:            "too large",
	ReasonWrongPlatform:       "wrong platform",
	ReasonInvalidImage:        "invalid image",
	ReasonRegistryUnavailable: "registry unavailable",
}

// PullError is every error Resolve and Ensure return about an image. Its
// message names the reference and the cause, for a Machine's status:
//
//	127.0.0.1:5000/team/app:1: unauthorized: the registry refused the credentials of imagePullSecrets
type PullError struct {
	// Reference is the image reference as the caller gave it.
	Reference string
	Reason    Reason
	// Err says what happened, in words a user understands.
	Err error
}

func (e *PullError) Error() string {
	w := words[e.Reason]
	if w == "" {
		w = string(e.Reason)
	}
	return fmt.Sprintf("%s: %s: %v", e.Reference, w, e.Err)
}

func (e *PullError) Unwrap() error { return e.Err }

// Transient reports whether trying again later may succeed: only when the
// registry was unreachable or failing. Every other reason is a property
// of the image or of the credentials, and a retry would fail the same way.
func (e *PullError) Transient() bool { return e.Reason == ReasonRegistryUnavailable }

func pullErrorf(ref string, reason Reason, format string, args ...any) *PullError {
	return &PullError{Reference: ref, Reason: reason, Err: fmt.Errorf(format, args...)}
}

// classify turns an error of a registry request into a PullError. anonymous
// says whether the request carried no credentials, which changes what an
// unauthorized answer means to the user.
func classify(ref string, err error, anonymous bool) *PullError {
	var pe *PullError
	if errors.As(err, &pe) {
		return pe
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// The caller gave up; not the registry's fault and not the image's.
		return &PullError{Reference: ref, Reason: ReasonRegistryUnavailable, Err: err}
	}
	if errors.Is(err, errManifestTooLarge) {
		return &PullError{Reference: ref, Reason: ReasonInvalidImage, Err: errManifestTooLarge}
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch {
		case terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden ||
			hasCode(terr, transport.UnauthorizedErrorCode, transport.DeniedErrorCode):
			if anonymous {
				return pullErrorf(ref, ReasonUnauthorized, "the registry requires credentials and no imagePullSecret holds any for it")
			}
			return pullErrorf(ref, ReasonUnauthorized, "the registry refused the credentials of imagePullSecrets")
		case terr.StatusCode == http.StatusNotFound ||
			hasCode(terr, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode):
			return pullErrorf(ref, ReasonNotFound, "the registry has no such repository, tag or digest")
		case terr.StatusCode == http.StatusTooManyRequests || terr.StatusCode >= 500 || terr.Temporary():
			return &PullError{Reference: ref, Reason: ReasonRegistryUnavailable, Err: fmt.Errorf("the registry answered %d %s", terr.StatusCode, http.StatusText(terr.StatusCode))}
		}
		return &PullError{Reference: ref, Reason: ReasonInvalidImage, Err: fmt.Errorf("the registry answered %d %s", terr.StatusCode, http.StatusText(terr.StatusCode))}
	}
	// What remains is the connection's (TLS, a body cut short): content
	// the store parsed and refused is a PullError already, raised where it
	// was read. Counting it transient costs a retry at worst.
	return &PullError{Reference: ref, Reason: ReasonRegistryUnavailable, Err: err}
}

func hasCode(terr *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range terr.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}
