package testenv

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ImageFile is one file of an image a test builds.
type ImageFile struct {
	Body string
	Mode int64 // 0: 0644
	UID  int
	GID  int
}

// BusyboxImage is a small linux/amd64 OCI image for guests: the static
// busybox of the default guest (bin/guest/default, `make guest`) as
// /bin/busybox with /bin/sh and the usual applets linked to it, an
// /etc/passwd and /etc/group with root and user "app" (1000:1000), the
// directories a root filesystem has, and files; config is its config
// (Env, WorkingDir, User, Entrypoint, Cmd…).
func BusyboxImage(t testing.TB, config v1.Config, files map[string]ImageFile) v1.Image {
	t.Helper()
	busybox := guestBusybox(t)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dir := func(name string, mode int64) {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: epoch}); err != nil {
			t.Fatal(err)
		}
	}
	file := func(name string, f ImageFile) {
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(f.Body)), Uid: f.UID, Gid: f.GID, ModTime: epoch}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, f.Body); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"bin", "etc", "dev", "proc", "sys", "run", "root", "home", "var", "usr", "usr/bin"} {
		dir(d, 0o755)
	}
	dir("tmp", 0o1777)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "home/app/", Mode: 0o755, Uid: 1000, Gid: 1000, ModTime: epoch}); err != nil {
		t.Fatal(err)
	}
	file("bin/busybox", ImageFile{Body: string(busybox), Mode: 0o755})
	for _, applet := range []string{"sh", "cat", "echo", "id", "pwd", "env", "ls", "sleep", "hostname", "mkdir", "rm", "sha256sum", "wget", "nc", "grep", "head", "true", "false", "uname", "ps"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777, ModTime: epoch}); err != nil {
			t.Fatal(err)
		}
	}
	file("etc/passwd", ImageFile{Body: "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n"})
	file("etc/group", ImageFile{Body: "root:x:0:\napp:x:1000:\n"})
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		file(name, files[name])
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layerBytes := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerBytes)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = config
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// guestBusybox is the static busybox of the default guest's initramfs.
func guestBusybox(t testing.TB) []byte {
	t.Helper()
	initramfs := filepath.Join(BinDir(t), "guest", "default", "initramfs.cpio.gz")
	dir := t.TempDir()
	cmd := exec.Command("sh", "-c", "gzip -dc \"$1\" | cpio -id --quiet bin/busybox", "sh", initramfs)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("taking busybox out of %s (make guest): %v: %s", initramfs, err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "bin", "busybox"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
