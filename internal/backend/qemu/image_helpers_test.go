package qemu

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zyvor/kairon/internal/imagefs"
)

// Image guests' root images, built by the tests as the node builds them
// (internal/imagefs): a squashfs holding rootfs/ and config.json, made
// from a tar with Debian's sqfstar.

// imageEntry is one entry of a test image's tree (under rootfs/).
type imageEntry struct {
	name     string // relative to rootfs/
	mode     int64  // permission bits
	uid, gid int
	dir      bool
	link     string // a symlink's target
	body     []byte
}

// buildRootImage makes a root image of entries and cfg in a temporary
// directory and returns its path.
func buildRootImage(tb testing.TB, cfg imagefs.Config, entries []imageEntry) string {
	tb.Helper()
	sqfstar, err := exec.LookPath("sqfstar")
	if err != nil {
		tb.Fatalf("sqfstar not found: install Debian's squashfs-tools (apt-get install squashfs-tools)")
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body []byte) {
		if err := tw.WriteHeader(h); err != nil {
			tb.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			tb.Fatal(err)
		}
	}
	cj, err := json.Marshal(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	add(&tar.Header{Name: imagefs.ConfigFile, Mode: 0o644, Size: int64(len(cj)), Typeflag: tar.TypeReg}, cj)
	add(&tar.Header{Name: imagefs.RootDir + "/", Mode: 0o755, Typeflag: tar.TypeDir}, nil)
	for _, e := range entries {
		h := &tar.Header{Name: imagefs.RootDir + "/" + e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid}
		switch {
		case e.dir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case e.link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.link, 0o777
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.body))
		}
		add(h, e.body)
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	out := filepath.Join(shortTempDir(tb), "root.sqfs")
	cmd := exec.Command(sqfstar, "-quiet", "-no-progress", "-comp", "zstd", out)
	cmd.Stdin = &buf
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("sqfstar: %v: %s", err, b)
	}
	return out
}

// guestBusybox is the static busybox of the built guest's initramfs, and
// the names of its applets.
func guestBusybox(tb testing.TB, guestDir string) ([]byte, []string) {
	tb.Helper()
	initrd := filepath.Join(guestDir, DefaultImage, "initramfs.cpio.gz")
	cmd := exec.Command("sh", "-c", `gzip -dc <"$1" | cpio -i --quiet --to-stdout bin/busybox`, "sh", initrd)
	bb, err := cmd.Output()
	if err != nil || len(bb) < 100_000 {
		tb.Fatalf("busybox from %s: %d bytes, %v (cpio: Debian package cpio)", initrd, len(bb), err)
	}
	f := filepath.Join(tb.TempDir(), "busybox")
	if err := os.WriteFile(f, bb, 0o755); err != nil {
		tb.Fatal(err)
	}
	list, err := exec.Command(f, "--list").Output()
	if err != nil {
		tb.Fatalf("busybox --list: %v", err)
	}
	return bb, strings.Fields(string(list))
}

// busyboxImage is a root image with busybox (every applet in /bin), a user
// app (1000, in group staff too) and what else extra holds.
func busyboxImage(tb testing.TB, guestDir string, cfg imagefs.Config, extra ...imageEntry) string {
	tb.Helper()
	bb, applets := guestBusybox(tb, guestDir)
	entries := []imageEntry{
		{name: "bin", dir: true, mode: 0o755},
		{name: "bin/busybox", mode: 0o755, body: bb},
		{name: "etc", dir: true, mode: 0o755},
		{name: "etc/passwd", mode: 0o644, body: []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:App:/home/app:/bin/sh\n")},
		{name: "etc/group", mode: 0o644, body: []byte("root:x:0:\napp:x:1000:\nstaff:x:50:app\n")},
		{name: "home", dir: true, mode: 0o755},
		{name: "home/app", dir: true, mode: 0o755, uid: 1000, gid: 1000},
		{name: "root", dir: true, mode: 0o700},
	}
	for _, a := range applets {
		if a != "busybox" {
			entries = append(entries, imageEntry{name: "bin/" + a, link: "busybox"})
		}
	}
	return buildRootImage(tb, cfg, append(entries, extra...))
}

// staticProgram builds src, a Go main package, as a static binary
// (CGO_ENABLED=0), and returns it.
func staticProgram(tb testing.TB, src string) []byte {
	tb.Helper()
	dir := tb.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		tb.Fatal(err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	cmd := exec.Command(goBin, "build", "-trimpath", "-o", "prog", "main.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOWORK=off", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("building a static test program: %v: %s", err, b)
	}
	b, err := os.ReadFile(filepath.Join(dir, "prog"))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// fileSum is the SHA-256 of the file at path.
func fileSum(tb testing.TB, path string) [32]byte {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		tb.Fatal(err)
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}
