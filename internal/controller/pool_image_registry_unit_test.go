package controller

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
)

// What RegistryResolver makes of what a registry answers: the digest of a
// HEAD, the GET's when the HEAD has none, kubelet's words for a refusal,
// and an error, not an endless read, for a manifest beyond the limit. Each
// registry is a handler on loopback.
func TestRegistryResolver(t *testing.T) {
	manifest := `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{},"layers":[]}`
	digest := fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(manifest)))
	serve := func(headDigest bool, body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v2/" {
				return
			}
			w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			if headDigest {
				w.Header().Set("Docker-Content-Digest", digest)
			}
			if r.Method == http.MethodGet {
				_, _ = w.Write([]byte(body))
			}
		}
	}
	refuse := func(status int, code, message string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v2/" {
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			if r.Method == http.MethodGet {
				fmt.Fprintf(w, `{"errors":[{"code":%q,"message":%q}]}`, code, message)
			}
		}
	}
	tests := []struct {
		name    string
		handler http.HandlerFunc
		digest  string
		err     []string
	}{
		{name: "HEAD names the digest", handler: serve(true, manifest), digest: digest},
		{name: "HEAD without a digest: GET", handler: serve(false, manifest), digest: digest},
		{name: "not found", handler: refuse(http.StatusNotFound, "MANIFEST_UNKNOWN", "manifest unknown"), err: []string{"/team/app:1: not found: the registry has no such repository, tag or digest"}},
		{name: "unauthorized", handler: refuse(http.StatusUnauthorized, "UNAUTHORIZED", "no"), err: []string{"/team/app:1: unauthorized: the registry requires credentials"}},
		{name: "forbidden", handler: refuse(http.StatusForbidden, "DENIED", "no"), err: []string{"unauthorized: "}},
		{name: "a manifest larger than the limit", handler: serve(false, `{"a":"`+strings.Repeat("x", 5<<20)+`"}`),
			err: []string{"the registry sent a manifest longer than"}},
		{name: "a registry's control characters and length", handler: func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v2/" {
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"errors":[{"code":"NAME_INVALID","message":"\u001b[31mred\n%s"}]}`, strings.Repeat("y", 2000))
		}, err: []string{"400 Bad Request"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler)
			defer srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			ref := strings.TrimPrefix(srv.URL, "http://") + "/team/app:1"
			got, err := RegistryResolver{}.Resolve(ctx, ref, authn.DefaultKeychain)
			if tt.err == nil {
				if err != nil || got != tt.digest {
					t.Fatalf("Resolve = %q, %v; want %q", got, err, tt.digest)
				}
				return
			}
			if err == nil {
				t.Fatalf("Resolve = %q, want an error", got)
			}
			for _, want := range tt.err {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			if strings.ContainsAny(err.Error(), "\x1b\n") || len(err.Error()) > 600 {
				t.Errorf("error carries the registry's control characters or is %d bytes long: %q", len(err.Error()), err)
			}
		})
	}
}
