package main

import (
	"io"
	"log"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/zyvor/kairon/internal/debimage"
)

// smallImage builds a one-layer image as the builder does and writes it
// as dir/kairon-controller.oci.tar.
func smallImage(t *testing.T, dir string) v1.Image {
	t.Helper()
	work := t.TempDir()
	b := &builder{o: options{out: dir, version: "1.2.3", registry: "example.com/kairon"}, date: time.Unix(1700000000, 0).UTC(), work: work}
	tr := debimage.Tree{}
	tr.File("etc/hello", []byte("hello\n"), 0o644)
	tr.Symlink("bin", "usr/bin")
	tr.Dir("tmp", 0o1777, 0, 0)
	img, err := b.image("kairon-controller", []layerSpec{{tr, "test"}}, v1.Config{User: "65532:65532"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.writeLayoutTar(img, "kairon-controller"); err != nil {
		t.Fatal(err)
	}
	return img
}

// push sends what the build wrote to <registry>/<name>:<version>, and the
// registry then serves the very image that was built.
func TestPushWritesTheBuiltImageToTheRegistry(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	dir := t.TempDir()
	img := smallImage(t, dir)
	want, _ := img.Digest()

	reg := strings.TrimPrefix(srv.URL, "http://") + "/team"
	if err := pushAll(options{out: dir, version: "1.2.3", registry: reg}); err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(reg + "/kairon-controller:1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := got.Digest(); d != want {
		t.Errorf("the registry serves %s, the build made %s", d, want)
	}
	cf, err := got.ConfigFile()
	if err != nil || cf.Config.User != "65532:65532" || cf.Config.Labels["org.opencontainers.image.version"] != "1.2.3" {
		t.Errorf("pushed config %+v (%v)", cf, err)
	}
	if err := pushAll(options{out: t.TempDir(), version: "1.2.3", registry: reg}); err == nil || !strings.Contains(err.Error(), "make images") {
		t.Errorf("push without images: %v", err)
	}
}
