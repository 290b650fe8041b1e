package agent

import (
	"archive/tar"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zyvor/kairon/internal/testenv/host"
)

// loopImage makes a squashfs of files (name to content; a name ending in
// / is a directory) with sqfstar and attaches it to a loop device,
// detached when the test ends.
func loopImage(t *testing.T, files map[string]string) string {
	t.Helper()
	host.SkipIfShort(t, "root, for a loop device and mounts")
	if os.Geteuid() != 0 {
		t.Fatal("needs root, for a loop device and mounts")
	}
	for _, tool := range []string{"sqfstar", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: install Debian's squashfs-tools and util-linux", tool)
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range files {
		h := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}
		if strings.HasSuffix(name, "/") {
			h.Mode, h.Size, h.Typeflag = 0o750, 0, tar.TypeDir
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(t.TempDir(), "img.sqfs")
	cmd := exec.Command("sqfstar", "-quiet", "-no-progress", img)
	cmd.Stdin = &buf
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sqfstar: %v: %s", err, out)
	}
	out, err := exec.Command("losetup", "--find", "--show", "--read-only", img).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "--detach", dev).Run() })
	return dev
}

// MountImage mounts the image and an overlay over its rootfs/ whose root
// has rootfs/'s mode, writable without touching the image; an image
// without its config is refused, and nothing stays mounted.
func TestMountImage(t *testing.T) {
	good := loopImage(t, map[string]string{"config.json": `{"user":"app"}`, "rootfs/": "", "rootfs/hello": "from the image"})
	bad := loopImage(t, map[string]string{"rootfs/": "", "rootfs/hello": "no config"})
	dir := t.TempDir()
	var goodErr, badErr error
	var mountsAfterBad string
	var wrote []byte
	var rootMode os.FileMode
	inMountNamespace(t, func() {
		m := ImageMountsUnder(filepath.Join(dir, "good"))
		if goodErr = MountImage(good, m); goodErr == nil {
			_ = os.WriteFile(filepath.Join(m.Root, "hello"), []byte("changed"), 0o644)
			wrote, _ = os.ReadFile(filepath.Join(m.RO, "rootfs", "hello"))
			if fi, err := os.Stat(m.Root); err == nil {
				rootMode = fi.Mode().Perm()
			}
		}
		badErr = MountImage(bad, ImageMountsUnder(filepath.Join(dir, "bad")))
		b, _ := os.ReadFile("/proc/thread-self/mountinfo")
		mountsAfterBad = string(b)
	})
	if goodErr != nil {
		t.Fatal(goodErr)
	}
	if string(wrote) != "from the image" || rootMode != 0o750 {
		t.Errorf("the image after a write to the overlay: %q; the overlay's root mode %v, want rootfs/'s 0750", wrote, rootMode)
	}
	if badErr == nil || !strings.Contains(badErr.Error(), "has no config.json file") {
		t.Errorf("an image without its config: %v", badErr)
	}
	if strings.Contains(mountsAfterBad, filepath.Join(dir, "bad")) {
		t.Errorf("a failed MountImage left mounts:\n%s", mountsAfterBad)
	}
}
