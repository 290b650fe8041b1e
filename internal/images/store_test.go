package images

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/zyvor/kairon/internal/imagefs"
	"github.com/zyvor/kairon/internal/testenv"
)

// capability is a security.capability value (cap_net_raw+ep), as setcap
// writes it for ping.
const capability = "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"

// TestEnsureConvertsLayers pulls a two-layer image and checks the squashfs
// it becomes: the layers flattened (whiteouts, an opaque directory, a file
// replaced, hard links within and across layers, a file added through a
// symlinked directory), ownership, modes with setuid, setgid and sticky
// bits, extended attributes, a FIFO, and config.json.
func TestEnsureConvertsLayers(t *testing.T) {
	reg := startRegistry(t, testenv.RegistryOptions{})
	base := layerOf(t,
		file{name: "etc/", typ: tar.TypeDir},
		file{name: "etc/motd", body: "hello"},
		file{name: "etc/removed", body: "x"},
		file{name: "usr/bin/", typ: tar.TypeDir},
		file{name: "usr/bin/su", body: "su", mode: 0o4755},
		file{name: "usr/bin/sg", body: "sg", mode: 0o2755, gid: 42},
		file{name: "usr/bin/ping", body: "ping", mode: 0o755, xattrs: map[string]string{"security.capability": capability, "user.note": "n"}},
		file{name: "usr/lib/a", body: "content-a"},
		file{name: "usr/lib/b", typ: tar.TypeLink, link: "usr/lib/a"},
		file{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"},
		file{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		file{name: "home/user/", typ: tar.TypeDir, mode: 0o700, uid: 1000, gid: 1000},
		file{name: "home/user/file", body: "mine", mode: 0o600, uid: 1000, gid: 1000},
		file{name: "var/cache/old", body: "old"},
		file{name: "run/fifo", typ: tar.TypeFifo, mode: 0o644},
	)
	top := layerOf(t,
		file{name: "etc/.wh.removed"},
		file{name: "var/cache/.wh..wh..opq"},
		file{name: "var/cache/new", body: "new"},
		file{name: "bin/added", body: "through the symlink", mode: 0o755},
		file{name: "etc/motd", body: "replaced"},
		file{name: "usr/lib/c", typ: tar.TypeLink, link: "usr/lib/a"},
	)
	cfg := v1.Config{Env: []string{"PATH=/usr/bin", "A=b"}, WorkingDir: "/home/user", User: "1000:1000",
		Entrypoint: []string{"/usr/bin/app"}, Cmd: []string{"--flag"}}
	digest := reg.Push(t, "team/app:1", imageOf(t, cfg, base, top))

	s := newStore(t, Options{})
	ref := reg.Ref("team/app:1")
	img, err := s.Ensure(ctxFor(t), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if img.Digest != digest || img.ManifestDigest != digest || img.Reference != ref {
		t.Fatalf("image %+v, want digest %s and reference %s", img, digest, ref)
	}
	fi, err := os.Stat(img.Path)
	if err != nil || fi.Size() != img.SizeBytes || fi.Mode().Perm() != 0o444 {
		t.Fatalf("image file: %v, %v; want %d bytes, read-only", fi, err, img.SizeBytes)
	}

	l := listSquashfs(t, img.Path)
	var top2 []string
	for p := range l {
		if p != "" && !strings.Contains(p, "/") {
			top2 = append(top2, p)
		}
	}
	slices.Sort(top2)
	if !slices.Equal(top2, []string{imagefs.ConfigFile, imagefs.RootDir}) {
		t.Fatalf("the squashfs root holds %v, want config.json and rootfs", top2)
	}
	for p, want := range map[string]listing{
		"":                            {mode: "drwxr-xr-x", owner: "0/0"},
		"rootfs":                      {mode: "drwxr-xr-x", owner: "0/0"},
		"rootfs/usr/bin/su":           {mode: "-rwsr-xr-x", owner: "0/0", size: "2"},
		"rootfs/usr/bin/sg":           {mode: "-rwxr-sr-x", owner: "0/42", size: "2"},
		"rootfs/tmp":                  {mode: "drwxrwxrwt", owner: "0/0"},
		"rootfs/home/user":            {mode: "drwx------", owner: "1000/1000"},
		"rootfs/home/user/file":       {mode: "-rw-------", owner: "1000/1000", size: "4"},
		"rootfs/bin":                  {mode: "lrwxrwxrwx", owner: "0/0", target: "usr/bin"},
		"rootfs/usr/bin/added":        {mode: "-rwxr-xr-x", owner: "0/0", size: "19"},
		"rootfs/var/cache/new":        {mode: "-rw-r--r--", owner: "0/0", size: "3"},
		"rootfs/run/fifo":             {mode: "prw-r--r--", owner: "0/0"},
		"rootfs/usr/lib/c":            {mode: "-rw-r--r--", owner: "0/0", size: "9"},
		imagefs.RootDir + "/etc/motd": {mode: "-rw-r--r--", owner: "0/0", size: "8"},
	} {
		got, ok := l[p]
		if !ok {
			t.Errorf("%q missing from the squashfs", p)
			continue
		}
		if got.mode != want.mode || got.owner != want.owner || (want.size != "" && got.size != want.size) || got.target != want.target {
			t.Errorf("%q: %+v, want %+v", p, got, want)
		}
	}
	for _, gone := range []string{"rootfs/etc/removed", "rootfs/var/cache/old", "rootfs/bin/added", "rootfs/etc/.wh.removed", "rootfs/var/cache/.wh..wh..opq"} {
		if _, ok := l[gone]; ok {
			t.Errorf("%q is in the squashfs; it should not be", gone)
		}
	}
	if got := catSquashfs(t, img.Path, "rootfs/etc/motd"); got != "replaced" {
		t.Errorf("etc/motd holds %q, want the upper layer's", got)
	}

	var c imagefs.Config
	if err := json.Unmarshal([]byte(catSquashfs(t, img.Path, imagefs.ConfigFile)), &c); err != nil {
		t.Fatal(err)
	}
	want := imagefs.Config{Env: cfg.Env, WorkingDir: cfg.WorkingDir, User: cfg.User, Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd, Digest: digest, Reference: ref}
	if !equalConfig(c, want) || !equalConfig(img.Config, want) {
		t.Errorf("config.json %+v, Image.Config %+v; want %+v", c, img.Config, want)
	}

	// Hard links and extended attributes, from the tree unsquashfs
	// extracts (as root, so that it sets security.* attributes).
	out := filepath.Join(t.TempDir(), "x")
	if b, err := exec.Command("unsquashfs", "-d", out, img.Path).CombinedOutput(); err != nil {
		t.Fatalf("unsquashfs: %v: %s", err, b)
	}
	inode := func(p string) uint64 {
		fi, err := os.Lstat(filepath.Join(out, p))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	if a, b, c := inode("rootfs/usr/lib/a"), inode("rootfs/usr/lib/b"), inode("rootfs/usr/lib/c"); a != b || a != c {
		t.Errorf("usr/lib/a, b and c have inodes %d, %d, %d; want one, hard-linked", a, b, c)
	}
	for name, want := range map[string]string{"security.capability": capability, "user.note": "n"} {
		buf := make([]byte, 256)
		n, err := unix.Lgetxattr(filepath.Join(out, "rootfs/usr/bin/ping"), name, buf)
		if err != nil || string(buf[:n]) != want {
			t.Errorf("usr/bin/ping's %s: %q, %v; want %q", name, buf[:max(n, 0)], err, want)
		}
	}

	if got, ok := s.Lookup(digest); !ok || got.Path != img.Path || got.Reference != ref {
		t.Errorf("Lookup(%s) = %+v, %v", digest, got, ok)
	}
}

func equalConfig(a, b imagefs.Config) bool {
	return slices.Equal(a.Env, b.Env) && a.WorkingDir == b.WorkingDir && a.User == b.User &&
		slices.Equal(a.Entrypoint, b.Entrypoint) && slices.Equal(a.Cmd, b.Cmd) && a.Digest == b.Digest && a.Reference == b.Reference
}

// wantPullError checks that err is a PullError of reason whose message
// holds each of parts.
func wantPullError(t testing.TB, err error, reason Reason, parts ...string) {
	t.Helper()
	var pe *PullError
	if !errors.As(err, &pe) {
		t.Fatalf("got %v (%T), want a PullError %s", err, err, reason)
	}
	if pe.Reason != reason {
		t.Fatalf("got reason %s (%v), want %s", pe.Reason, err, reason)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("message %q does not say %q", err, p)
		}
	}
	if pe.Transient() != (reason == ReasonRegistryUnavailable) {
		t.Fatalf("Transient() = %v for %s", pe.Transient(), reason)
	}
}
