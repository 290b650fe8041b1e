package agent

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/zyvor/kairon/internal/guestagent/wire"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// inMountNamespace runs fn on an OS thread with a private mount namespace
// of its own, so that what fn mounts is nobody else's and goes away with
// the thread (never handed back to the runtime).
func inMountNamespace(t *testing.T, fn func()) {
	t.Helper()
	done := make(chan struct{})
	var failure error
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			failure = err
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			failure = err
			return
		}
		fn()
	}()
	<-done
	if failure != nil {
		t.Fatalf("a mount namespace: %v", failure)
	}
}

// An image whose mount points are symlinks or files, whose /tmp is a
// symlink to a private directory, and whose identity files are symlinks
// out of it: PrepareRoot mounts on real directories of the root, makes
// the /tmp it points at 1777, the working directory, and writes regular
// identity files in the root, leaving what the symlinks pointed at alone.
func TestPrepareRoot(t *testing.T) {
	host.SkipIfShort(t, "root, to mount")
	if os.Geteuid() != 0 {
		t.Fatal("needs root, to mount")
	}
	outside := t.TempDir()
	for _, f := range []string{"resolv.conf", "hosts", "hostname"} {
		if err := os.WriteFile(filepath.Join(outside, f), []byte("outside\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"proc":            "->/etc",
		"sys":             "a file",
		"run":             "->../../../..",
		"var/tmp/":        "",
		"tmp":             "->/var/tmp",
		"etc/resolv.conf": "->" + filepath.Join(outside, "resolv.conf"),
		"etc/hosts":       "->" + strings.Repeat("../", 20) + filepath.Join(outside, "hosts")[1:],
		"etc/hostname":    "->/etc/hostname",
		"srv/":            "",
	})
	if err := os.Chmod(filepath.Join(root, "var", "tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	setup := RootSetup{
		Root:       root,
		Identity:   GuestIdentity{Hostname: "img-1", Address: netip.MustParseAddr("10.88.0.5"), DNS: []string{"10.88.0.1", "192.0.2.53"}},
		WorkingDir: "/srv/app/work",
	}
	var mounts string
	var perr error
	inMountNamespace(t, func() {
		perr = PrepareRoot(setup)
		b, _ := os.ReadFile("/proc/thread-self/mountinfo")
		mounts = string(b)
	})
	if perr != nil {
		t.Fatal(perr)
	}
	for _, m := range []string{"proc proc", "sys sysfs", "dev devtmpfs", "dev/pts devpts", "dev/shm tmpfs", "run tmpfs"} {
		target, fstype, _ := strings.Cut(m, " ")
		found := false
		for line := range strings.SplitSeq(mounts, "\n") {
			f := strings.Fields(line)
			if len(f) > 9 && f[4] == filepath.Join(root, target) && f[len(f)-3] == fstype {
				found = true
			}
		}
		if !found {
			t.Errorf("no %s mounted at /%s in the root:\n%s", fstype, target, mounts)
		}
	}
	for _, d := range []string{"proc", "sys", "run", "dev"} {
		if fi, err := os.Lstat(filepath.Join(root, d)); err != nil || !fi.IsDir() {
			t.Errorf("/%s: %v %v, want a directory", d, fi, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "var", "tmp")); err != nil || fi.Mode()&os.ModePerm != 0o777 || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("/tmp -> /var/tmp: %v %v, want 1777", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "srv", "app", "work")); err != nil || !fi.IsDir() {
		t.Errorf("the working directory: %v %v", fi, err)
	}
	for name, want := range map[string]string{
		"hostname":    "img-1\n",
		"hosts":       "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n10.88.0.5\timg-1\n",
		"resolv.conf": "nameserver 10.88.0.1\nnameserver 192.0.2.53\n",
	} {
		p := filepath.Join(root, "etc", name)
		fi, err := os.Lstat(p)
		b, _ := os.ReadFile(p)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 || string(b) != want {
			t.Errorf("/etc/%s: %v %v %q, want a regular file with %q", name, fi, err, b, want)
		}
		if b, _ := os.ReadFile(filepath.Join(outside, name)); name != "hostname" && string(b) != "outside\n" {
			t.Errorf("what /etc/%s pointed at was written: %q", name, b)
		}
	}
	if b, _ := os.ReadFile("/etc/hostname"); string(b) == "img-1\n" {
		t.Error("the host's /etc/hostname was written")
	}
	ents, _ := os.ReadDir(filepath.Join(root, "etc"))
	if len(ents) != 3 {
		t.Errorf("/etc holds %v, want the three files and no temporary one", ents)
	}
}

// A write that fails leaves the file as it was and no temporary file.
func TestReplaceInRootFails(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{"d/f": "old"})
	err := replaceInRoot(root, "/d/f", 0o644, func(f *os.File) error {
		_, _ = f.WriteString("half")
		return errors.New("the host went away")
	})
	if err == nil {
		t.Fatal("no error")
	}
	if b, _ := os.ReadFile(filepath.Join(root, "d", "f")); string(b) != "old" {
		t.Errorf("the file: %q", b)
	}
	if ents, _ := os.ReadDir(filepath.Join(root, "d")); len(ents) != 1 {
		t.Errorf("left behind: %v", ents)
	}
	for _, p := range []string{"/", "/d/..", "/missing/f"} {
		if err := replaceInRoot(root, p, 0o644, func(*os.File) error { return nil }); err == nil {
			t.Errorf("writing %s: no error", p)
		}
	}
}

// A configure request's identity for the image: its hostname (or the
// guest's when it names only an address), first address and nameservers.
func TestImageIdentity(t *testing.T) {
	got := imageIdentity(&wire.Configure{Hostname: "clone-a", Addresses: []string{"10.88.0.11/24", "10.88.0.12/24"}, DNS: []string{"10.88.0.1"}})
	if got.Hostname != "clone-a" || got.Address != netip.MustParseAddr("10.88.0.11") || len(got.DNS) != 1 {
		t.Errorf("%+v", got)
	}
	me, _ := os.Hostname()
	if got := imageIdentity(&wire.Configure{Addresses: []string{"10.88.0.11/24"}}); got.Hostname != me {
		t.Errorf("address only: %+v, want hostname %q", got, me)
	}
	if got := imageIdentity(&wire.Configure{Seed: []byte{1}}); got.Hostname != "" || got.Address.IsValid() || got.DNS != nil {
		t.Errorf("seed only: %+v", got)
	}
	if hostsFile(GuestIdentity{Hostname: "h"}) != "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\th\n" {
		t.Errorf("hosts without an address: %q", hostsFile(GuestIdentity{Hostname: "h"}))
	}
}
