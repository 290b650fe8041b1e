package userimages

import (
	"context"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/zyvor/kairon/internal/debimage"
)

// fakeImage is an Image whose build is one small layer and counts its
// calls; its lock names one package, whose .deb the cache is given so
// that nothing is downloaded.
func fakeImage(t *testing.T, cache string, recipe int, builds *atomic.Int32) Image {
	t.Helper()
	lock := []byte("# source-date-epoch: 1796688000\nfake=1.0\n")
	if err := os.MkdirAll(filepath.Join(cache, "debs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cache, "debs", "fake_1.0_amd64.deb"), []byte("not read"), 0o644); err != nil {
		t.Fatal(err)
	}
	return Image{Repository: "kairon/fake", Tag: "1", lock: lock, recipe: recipe, build: func(b *build) (v1.Image, error) {
		builds.Add(1)
		tr := debimage.Tree{}
		tr.File("etc/fake", []byte("fake\n"), 0o644)
		return debimage.Assemble(b.work, b.lock.Date, "test", []debimage.Layer{{Tree: tr, CreatedBy: "test"}},
			v1.Config{Labels: map[string]string{KeyLabel: b.image.Key()}})
	}}
}

func testRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// Ensure pushes a build the registry lacks, and only then: a second call
// sends nothing, a call with an empty cache builds nothing (the registry
// holds this build), and another image under the tag is replaced.
func TestEnsurePushesOnlyWhatTheRegistryLacks(t *testing.T) {
	ctx := context.Background()
	reg := testRegistry(t)
	cache := t.TempDir()
	var builds atomic.Int32
	img := fakeImage(t, cache, 1, &builds)

	first, err := img.Ensure(ctx, reg, Options{CacheDir: cache})
	if err != nil {
		t.Fatal(err)
	}
	if !first.Built || !first.Pushed || first.Reference != reg+"/kairon/fake:1" {
		t.Fatalf("first Ensure = %+v, want built and pushed to %s/kairon/fake:1", first, reg)
	}
	ref, _ := name.ParseReference(first.Reference)
	served, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := served.Digest(); d != first.Digest {
		t.Errorf("the registry serves %s, Ensure pushed %s", d, first.Digest)
	}

	again, err := img.Ensure(ctx, reg, Options{CacheDir: cache})
	if err != nil || again.Built || again.Pushed || again.Digest != first.Digest {
		t.Errorf("second Ensure = %+v, %v; want nothing built or pushed, digest %s", again, err, first.Digest)
	}
	otherCache := t.TempDir()
	fresh := fakeImage(t, otherCache, 1, &builds)
	if r, err := fresh.Ensure(ctx, reg, Options{CacheDir: otherCache}); err != nil || r.Built || r.Pushed {
		t.Errorf("Ensure with an empty cache against a registry holding the build = %+v, %v; want neither built nor pushed", r, err)
	}
	if n := builds.Load(); n != 1 {
		t.Errorf("%d builds, want 1", n)
	}

	// Someone else's image under the tag is not this build.
	other, _ := random.Image(64, 1)
	if err := remote.Write(ref, other); err != nil {
		t.Fatal(err)
	}
	if r, err := img.Ensure(ctx, reg, Options{CacheDir: cache}); err != nil || r.Built || !r.Pushed || r.Digest != first.Digest {
		t.Errorf("Ensure over another image = %+v, %v; want the cached build pushed", r, err)
	}

	// A new recipe is another build; the old one leaves the cache.
	newer := fakeImage(t, cache, 2, &builds)
	if r, err := newer.Ensure(ctx, reg, Options{CacheDir: cache}); err != nil || !r.Built || !r.Pushed {
		t.Errorf("Ensure of a new recipe = %+v, %v; want built and pushed", r, err)
	}
	old, _ := img.CachedLayout(Options{CacheDir: cache})
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("the old build's layout %s is still cached (%v)", old, err)
	}
	if left, _ := filepath.Glob(filepath.Join(cache, ".build-*")); len(left) > 0 {
		t.Errorf("scratch directories left in the cache: %v", left)
	}

	if _, err := img.Ensure(ctx, "127.0.0.1:1", Options{CacheDir: cache}); err == nil || !strings.Contains(err.Error(), "asking the registry for 127.0.0.1:1/kairon/fake:1") {
		t.Errorf("Ensure against no registry: %v", err)
	}
}

// Callers that build one image at once, in one process or several, build
// it once: the others wait for the cache's lock and read the result.
func TestConcurrentBuildsBuildOnce(t *testing.T) {
	cache := t.TempDir()
	var builds atomic.Int32
	img := fakeImage(t, cache, 1, &builds)
	var wg sync.WaitGroup
	digests := make([]v1.Hash, 4)
	for i := range digests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, _, err := img.Build(context.Background(), Options{CacheDir: cache})
			if err != nil {
				t.Error(err)
				return
			}
			digests[i], _ = got.Digest()
		}()
	}
	wg.Wait()
	if n := builds.Load(); n != 1 {
		t.Errorf("%d builds, want 1", n)
	}
	for _, d := range digests[1:] {
		if d != digests[0] {
			t.Errorf("digests differ: %v", digests)
		}
	}
}

// The key follows the lock and the recipe, nothing else.
func TestKey(t *testing.T) {
	a := Image{Repository: "kairon/python", Tag: "3.11", lock: []byte("x=1\n"), recipe: 1}
	same := a
	otherLock, otherRecipe, otherTag := a, a, a
	otherLock.lock = []byte("x=2\n")
	otherRecipe.recipe = 2
	otherTag.Tag = "3.12"
	if a.Key() != same.Key() {
		t.Error("one image, two keys")
	}
	for _, o := range []Image{otherLock, otherRecipe, otherTag} {
		if o.Key() == a.Key() {
			t.Errorf("%+v has the key of %+v", o, a)
		}
	}
}

// What the python image leaves out of its packages, as dpkg's
// path-exclude lines in the image say.
func TestSlimExclude(t *testing.T) {
	for p, want := range map[string]bool{
		"usr/share/doc/bash/copyright":            false,
		"usr/share/doc/bash/README":               true,
		"usr/share/doc/bash":                      true,
		"usr/share/doc":                           false,
		"usr/share/man/man1/bash.1.gz":            true,
		"usr/share/man":                           false,
		"usr/share/locale/de/LC_MESSAGES/x.mo":    true,
		"usr/share/info/dir":                      true,
		"usr/share/lintian/overrides/bash":        true,
		"usr/lib/python3.11/os.py":                false,
		"usr/share/ca-certificates/mozilla/x.crt": false,
		"usr/share/manifest":                      false,
	} {
		if got := slimExclude(p); got != want {
			t.Errorf("slimExclude(%q) = %t, want %t", p, got, want)
		}
	}
}
