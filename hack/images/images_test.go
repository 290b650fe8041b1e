package main

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// smallImage builds a one-layer image as the builder does and writes it
// as dir/kairon-controller.oci.tar.
func smallImage(t *testing.T, dir string) v1.Image {
	t.Helper()
	work := t.TempDir()
	b := &builder{o: options{out: dir, version: "1.2.3", registry: "example.com/kairon"}, date: time.Unix(1700000000, 0).UTC(), work: work}
	tr := tree{}
	tr.file("etc/hello", []byte("hello\n"), 0o644)
	tr.symlink("bin", "usr/bin")
	tr.dir("tmp", 0o1777, 0, 0)
	img, err := b.image("kairon-controller", []layerSpec{{tr, "test"}}, v1.Config{User: "65532:65532"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.writeLayoutTar(img, "kairon-controller"); err != nil {
		t.Fatal(err)
	}
	return img
}

// A layer's tar lists parents before children, every entry at the one
// date, with numeric owners only; the same tree gives the same bytes.
func TestLayerTarIsFixed(t *testing.T) {
	tr := tree{}
	tr.file("usr/share/b", []byte("b"), 0o644)
	tr.file("etc/a", []byte("a"), 0o600)
	tr.symlink("bin", "usr/bin")
	date := time.Unix(1700000000, 0).UTC()
	dir := t.TempDir()
	one, two := filepath.Join(dir, "1.tar"), filepath.Join(dir, "2.tar")
	if err := tr.writeTar(one, date); err != nil {
		t.Fatal(err)
	}
	if err := tr.writeTar(two, date); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(one)
	b, _ := os.ReadFile(two)
	if !bytes.Equal(a, b) {
		t.Fatal("two writes of one tree differ")
	}
	var names []string
	r := tar.NewReader(bytes.NewReader(a))
	for {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(date) || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: time %s, owner names %q %q", h.Name, h.ModTime, h.Uname, h.Gname)
		}
		names = append(names, h.Name)
	}
	want := "bin etc/ etc/a usr/ usr/share/ usr/share/b"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("entries %q, want %q", got, want)
	}
}

// Packages' /bin, /sbin and /lib land in /usr, as on a merged-/usr system.
func TestMergedUsr(t *testing.T) {
	for in, want := range map[string]string{
		"bin/dash": "usr/bin/dash", "lib64/ld-linux-x86-64.so.2": "usr/lib64/ld-linux-x86-64.so.2",
		"sbin/ip": "usr/sbin/ip", "usr/bin/ip": "usr/bin/ip", "etc/x": "etc/x", "binx/y": "binx/y",
	} {
		if got := mergedUsr(in); got != want {
			t.Errorf("mergedUsr(%q) = %q, want %q", in, got, want)
		}
	}
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
