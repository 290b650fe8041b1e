package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"unicode"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// ImageResolver finds the digest of the manifest (or index) an OCI
// reference names now. The pool controller asks it once per template, with
// the credentials of the template's imagePullSecrets.
type ImageResolver interface {
	Resolve(ctx context.Context, ref string, keychain authn.Keychain) (digest string, err error)
}

// registryBodyLimit caps every body a registry sends the controller: a
// manifest (the distribution spec's own limit is 4 MiB), a token, an error.
// The registry is whoever the user's reference names.
const registryBodyLimit = 4 << 20

// RegistryResolver is the ImageResolver that asks the registry, with
// go-containerregistry: a HEAD of the manifest, which answers with its
// digest, and a GET for a registry that leaves the digest out of its HEAD
// answer or refuses it for a reason other than not found or unauthorized
// (a HEAD's answer has no body to say which). A registry on a loopback or private address is spoken to in
// plain HTTP, as go-containerregistry does by itself.
type RegistryResolver struct {
	// Transport is what the requests go through; nil means
	// remote.DefaultTransport.
	Transport http.RoundTripper
}

// Resolve implements ImageResolver.
func (r RegistryResolver) Resolve(ctx context.Context, ref string, keychain authn.Keychain) (string, error) {
	parsed, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("parsing the reference: %w", err)
	}
	inner := r.Transport
	if inner == nil {
		inner = remote.DefaultTransport
	}
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(keychain),
		remote.WithTransport(limitedBodies{inner}),
		remote.WithUserAgent("kairon-controller"),
	}
	desc, err := remote.Head(parsed, opts...)
	if err == nil {
		return desc.Digest.String(), nil
	}
	var answered *transport.Error
	var netErr net.Error
	refused := errors.As(err, &answered) && slices.Contains([]int{http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound}, answered.StatusCode)
	if refused || errors.As(err, &netErr) || ctx.Err() != nil {
		return "", registryError(err)
	}
	// The registry answered the HEAD without a digest or a length, or
	// with an error whose reason, in a HEAD, it could not say.
	got, err := remote.Get(parsed, opts...)
	if err != nil {
		return "", registryError(err)
	}
	return got.Digest.String(), nil
}

// registryError says what went wrong in the words kubelet uses for an
// image pull (not found, unauthorized), followed by what the registry
// said, cleaned of control characters and cut short: the registry's text
// is the registry owner's, on its way into a status and an event.
func registryError(err error) error {
	var answered *transport.Error
	cause := ""
	if errors.As(err, &answered) {
		switch answered.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			cause = "unauthorized"
		case http.StatusNotFound:
			cause = "not found"
		default:
			for _, d := range answered.Errors {
				switch d.Code {
				case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode:
					cause = "not found"
				case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
					cause = "unauthorized"
				}
			}
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		cause = "timed out"
	}
	text := registryText(err.Error())
	if answered != nil && len(answered.Errors) == 0 && answered.Request != nil {
		// go-containerregistry's words for a HEAD's status would send the
		// reader to a GET they cannot make.
		text = registryText(fmt.Sprintf("%s %s: %d %s", answered.Request.Method, answered.Request.URL.Redacted(),
			answered.StatusCode, http.StatusText(answered.StatusCode)))
	}
	if cause == "" {
		return errors.New(text)
	}
	return fmt.Errorf("%s: %s", cause, text)
}

// registryText is s with control characters replaced by spaces, at most
// 512 bytes.
func registryText(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	return truncate(strings.Join(strings.Fields(s), " "), 512)
}

// limitedBodies ends every response body after registryBodyLimit bytes
// with an error, so that no registry makes the controller read without
// end.
type limitedBodies struct{ next http.RoundTripper }

func (l limitedBodies) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	resp.Body = &limitedBody{ReadCloser: resp.Body, left: registryBodyLimit}
	return resp, nil
}

type limitedBody struct {
	io.ReadCloser
	left int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// A body of exactly the limit ends here; a longer one does not.
		var one [1]byte
		if n, err := b.ReadCloser.Read(one[:]); n == 0 && err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("the registry's answer is longer than %d bytes", registryBodyLimit)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}
