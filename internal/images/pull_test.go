package images

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/zyvor/kairon/internal/testenv"
)

func simpleImage(t testing.TB, content string) v1.Image {
	t.Helper()
	return imageOf(t, v1.Config{Cmd: []string{"/app"}}, layerOf(t, file{name: "app", body: content, mode: 0o755}))
}

// TestEnsureWithAuth pulls from a registry with basic authentication: a
// wrong password and no credentials are refused with what went wrong,
// the right password pulls, and the cached private image is served by
// digest only to credentials the registry accepts.
func TestEnsureWithAuth(t *testing.T) {
	reg := startRegistry(t, testenv.RegistryOptions{Users: map[string]string{"alice": "s3cret"}})
	digest := reg.Push(t, "private/app:1", simpleImage(t, "private"))
	s := newStore(t, Options{})
	ctx := ctxFor(t)
	ref := reg.Ref("private/app:1")

	_, err := s.Ensure(ctx, ref, keychainFor(t, reg.Addr, "alice", "wrong"))
	wantPullError(t, err, ReasonUnauthorized, ref+": unauthorized: the registry refused the credentials of imagePullSecrets")
	_, err = s.Ensure(ctx, ref, nil)
	wantPullError(t, err, ReasonUnauthorized, ref+": unauthorized: the registry requires credentials and no imagePullSecret holds any for it")
	_, err = s.Resolve(ctx, ref, keychainFor(t, reg.Addr, "alice", "wrong"))
	wantPullError(t, err, ReasonUnauthorized, "refused the credentials")

	good := keychainFor(t, reg.Addr, "alice", "s3cret")
	if d, err := s.Resolve(ctx, ref, good); err != nil || d != digest {
		t.Fatalf("Resolve = %s, %v; want %s", d, err, digest)
	}
	img, err := s.Ensure(ctx, ref, good)
	if err != nil {
		t.Fatal(err)
	}
	if img.Digest != digest {
		t.Fatalf("pulled %s, want %s", img.Digest, digest)
	}

	byDigest := reg.Ref("private/app@" + digest)
	_, err = s.Ensure(ctx, byDigest, nil)
	wantPullError(t, err, ReasonUnauthorized, byDigest+": unauthorized")
	_, err = s.Ensure(ctx, byDigest, keychainFor(t, reg.Addr, "alice", "wrong"))
	wantPullError(t, err, ReasonUnauthorized, "refused the credentials")
	if again, err := s.Ensure(ctx, byDigest, good); err != nil || again.Path != img.Path {
		t.Fatalf("Ensure by digest with the credentials: %+v, %v", again, err)
	}
	if _, ok := s.Lookup(digest); !ok {
		t.Fatalf("Lookup(%s) found nothing", digest)
	}
}

// TestEnsureNotFound asks for a tag and a repository the registry lacks,
// and a registry that is not there.
func TestEnsureNotFound(t *testing.T) {
	reg := startRegistry(t, testenv.RegistryOptions{})
	reg.Push(t, "team/app:1", simpleImage(t, "x"))
	s := newStore(t, Options{})
	ctx := ctxFor(t)
	for _, ref := range []string{reg.Ref("team/app:2"), reg.Ref("team/nope:1"),
		reg.Ref("team/app@sha256:" + strings.Repeat("a", 64))} {
		_, err := s.Ensure(ctx, ref, nil)
		wantPullError(t, err, ReasonNotFound, ref+": not found: the registry has no such repository, tag or digest")
		if !strings.Contains(ref, "@") {
			_, err = s.Resolve(ctx, ref, nil)
			wantPullError(t, err, ReasonNotFound, ref+": not found")
		}
	}
	if files := cacheFiles(t, s.opts.Dir); len(files) != 0 {
		t.Fatalf("the cache holds %v after failed pulls", files)
	}
}

// TestRegistryUnavailable pulls from a port nobody listens on: a
// transient failure.
func TestRegistryUnavailable(t *testing.T) {
	reg := startRegistry(t, testenv.RegistryOptions{})
	reg.Stop()
	s := newStore(t, Options{})
	ref := reg.Ref("team/app:1")
	_, err := s.Ensure(ctxFor(t), ref, nil)
	wantPullError(t, err, ReasonRegistryUnavailable, ref+": registry unavailable:", "connection refused")
	_, err = s.Resolve(ctxFor(t), ref, nil)
	wantPullError(t, err, ReasonRegistryUnavailable, "connection refused")
}

// TestInvalidReference refuses references the store cannot use.
func TestInvalidReference(t *testing.T) {
	s := newStore(t, Options{})
	for _, ref := range []string{"team/app:1", "app", "127.0.0.1:5000/Team/App", ""} {
		_, err := s.Ensure(context.Background(), ref, nil)
		wantPullError(t, err, ReasonInvalidImage, ref+": invalid image")
	}
}

// TestMovedTag moves a tag to another image: Resolve gives the new digest,
// the old digest is still served from the cache without the registry, and
// Ensure of the tag pulls the new image.
func TestMovedTag(t *testing.T) {
	reg := startRegistry(t, testenv.RegistryOptions{})
	proxy := newCountingProxy(t, reg.Addr)
	s := newStore(t, Options{})
	ctx := ctxFor(t)
	ref := proxy.Addr + "/team/app:1"

	d1 := reg.Push(t, "team/app:1", simpleImage(t, "one"))
	img1, err := s.Ensure(ctx, ref, nil)
	if err != nil || img1.Digest != d1 {
		t.Fatalf("Ensure = %+v, %v; want %s", img1, err, d1)
	}
	d2 := reg.Push(t, "team/app:1", simpleImage(t, "two"))
	if d, err := s.Resolve(ctx, ref, nil); err != nil || d != d2 {
		t.Fatalf("Resolve after the move = %s, %v; want %s", d, err, d2)
	}

	before := proxy.total()
	old, err := s.Ensure(ctx, proxy.Addr+"/team/app@"+d1, nil)
	if err != nil || old.Path != img1.Path || old.Digest != d1 {
		t.Fatalf("Ensure of the old digest = %+v, %v; want the cached %s", old, err, img1.Path)
	}
	if n := proxy.total() - before; n != 0 {
		t.Fatalf("Ensure of a cached digest made %d registry requests, want none", n)
	}

	img2, err := s.Ensure(ctx, ref, nil)
	if err != nil || img2.Digest != d2 || img2.Path == img1.Path {
		t.Fatalf("Ensure after the move = %+v, %v; want %s in a file of its own", img2, err, d2)
	}
	if got := catSquashfs(t, img2.Path, "rootfs/app"); got != "two" {
		t.Fatalf("the new image holds %q", got)
	}
	if _, ok := s.Lookup(d1); !ok {
		t.Fatal("the old image left the cache")
	}
}

// TestConcurrentEnsurePullsOnce has ten callers ask for one new image at
// once, by tag and by digest: each blob is downloaded once, and every
// caller gets the same file.
func TestConcurrentEnsurePullsOnce(t *testing.T) {
	reg := startRegistry(t, testenv.RegistryOptions{})
	proxy := newCountingProxy(t, reg.Addr)
	img := imageOf(t, v1.Config{}, layerOf(t, file{name: "a", body: "1"}), layerOf(t, file{name: "b", body: "2"}), layerOf(t, file{name: "c", body: "3"}))
	digest := reg.Push(t, "team/app:1", img)
	m := &fakeMetrics{}
	s := newStore(t, Options{Metrics: m})
	ctx := ctxFor(t)

	// The blobs wait until every caller has asked, so that all ten are
	// in flight together.
	held, release := proxy.holdBlobs()
	var wg sync.WaitGroup
	paths := make([]string, 10)
	errs := make([]error, 10)
	for i := range 10 {
		ref := proxy.Addr + "/team/app:1"
		if i%2 == 1 {
			ref = proxy.Addr + "/team/app@" + digest
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := s.Ensure(ctx, ref, nil)
			errs[i] = err
			if err == nil {
				paths[i] = got.Path
			}
		}()
	}
	<-held
	testenv.Eventually(t, waitTimeout, "both references' manifests fetched", func() (bool, string) {
		n := proxy.count("GET", "/manifests/")
		return n >= 2, ""
	})
	release()
	wg.Wait()
	for i := range 10 {
		if errs[i] != nil || paths[i] != paths[0] {
			t.Fatalf("caller %d: %v, %s; want %s", i, errs[i], paths[i], paths[0])
		}
	}
	layers, _ := img.Layers()
	cfg, _ := img.ConfigName()
	blobs := []string{cfg.String()}
	for _, l := range layers {
		d, _ := l.Digest()
		blobs = append(blobs, d.String())
	}
	for _, b := range blobs {
		if n := proxy.count("GET", "/blobs/"+b); n != 1 {
			t.Errorf("blob %s downloaded %d times, want once", b, n)
		}
	}
	got := m.snapshot()
	if got.pulls != 1 || got.converts != 1 || got.hits+got.misses != 10 || got.images != 1 || got.bytes == 0 {
		t.Errorf("metrics %+v: want one pull, one conversion, ten Ensures, one image", got)
	}
}

// TestEnsureIndex pulls an image index: the linux/amd64 image is the one
// converted, known by the index's digest and its own.
func TestEnsureIndex(t *testing.T) {
	reg := startRegistry(t, testenv.RegistryOptions{})
	amd := simpleImage(t, "amd64")
	arm := imageFor(t, "linux", "arm64", v1.Config{}, layerOf(t, file{name: "app", body: "arm64"}))
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	idxDigest := reg.PushIndex(t, "team/multi:1", idx)
	amdDigest, _ := amd.Digest()
	s := newStore(t, Options{})
	ctx := ctxFor(t)
	img, err := s.Ensure(ctx, reg.Ref("team/multi:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if img.Digest != idxDigest || img.ManifestDigest != amdDigest.String() {
		t.Fatalf("image %+v: want digest %s, manifest %s", img, idxDigest, amdDigest)
	}
	if got := catSquashfs(t, img.Path, "rootfs/app"); got != "amd64" {
		t.Fatalf("converted the %q image", got)
	}
	if d, err := s.Resolve(ctx, reg.Ref("team/multi:1"), nil); err != nil || d != idxDigest {
		t.Fatalf("Resolve = %s, %v; want the index's %s", d, err, idxDigest)
	}
	for _, d := range []string{idxDigest, amdDigest.String()} {
		if got, ok := s.Lookup(d); !ok || got.Path != img.Path || got.Digest != d {
			t.Fatalf("Lookup(%s) = %+v, %v", d, got, ok)
		}
	}
}

// TestEnsureCancelled gives up on a pull while its blobs download: the
// call returns the context's error and leaves no file behind.
func TestEnsureCancelled(t *testing.T) {
	reg := startRegistry(t, testenv.RegistryOptions{})
	proxy := newCountingProxy(t, reg.Addr)
	reg.Push(t, "team/app:1", simpleImage(t, "x"))
	s := newStore(t, Options{})
	held, release := proxy.holdBlobs()
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.Ensure(ctx, proxy.Addr+"/team/app:1", nil)
		done <- err
	}()
	<-held
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	// The pull stops in the background once no caller waits for it.
	testenv.Eventually(t, waitTimeout, "no temporary file left", func() (bool, string) {
		files := cacheFiles(t, s.opts.Dir)
		return len(files) == 0, strings.Join(files, " ")
	})
}
