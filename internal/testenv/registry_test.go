package testenv

import (
	"errors"
	"net/http"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// TestRegistry pushes an image to a registry with authentication and
// pulls it back by digest, and checks that a wrong password is refused.
func TestRegistry(t *testing.T) {
	r := StartRegistry(t, RegistryOptions{Users: map[string]string{"alice": "s3cret"}})
	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	digest := r.Push(t, "team/app:1", img)

	ref, err := name.ParseReference(r.Ref("team/app@" + digest))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Get(ref, remote.WithAuth(&authn.Basic{Username: "alice", Password: "s3cret"})); err != nil {
		t.Fatalf("pulling %s with the right password: %v", ref, err)
	}
	_, err = remote.Get(ref, remote.WithAuth(&authn.Basic{Username: "alice", Password: "wrong"}))
	var terr *transport.Error
	if !errors.As(err, &terr) || terr.StatusCode != http.StatusUnauthorized {
		t.Fatalf("pulling %s with a wrong password: got %v, want 401 Unauthorized", ref, err)
	}
}

// TestRegistryAnonymous pushes and pulls without authentication.
func TestRegistryAnonymous(t *testing.T) {
	r := StartRegistry(t, RegistryOptions{})
	img, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	r.Push(t, "app:latest", img)
	ref, err := name.ParseReference(r.Ref("app:latest"))
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Head(ref)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if desc.Digest != want {
		t.Fatalf("%s is %s, want %s", ref, desc.Digest, want)
	}
}
