package agent

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// Paths inside an image's root. The image is the user's, so untrusted: a
// symlink in it may point anywhere, /etc itself may be one. Every path the
// agent opens there for the host (a file read or written, /etc/passwd, a
// program looked up in PATH) is resolved by the kernel with openat2's
// RESOLVE_IN_ROOT, as if the root were "/" (the guest kernel is 6.1; the
// flag exists since 5.6): an absolute symlink or a ".." never leaves it.

// resolveInRoot is how every path in an image is resolved. Magic links
// (/proc/self/fd/N and the like, once proc is mounted in the root) could
// lead anywhere, and are refused.
const resolveInRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// inRoot is p relative to the root: what openat2 takes with RESOLVE_IN_ROOT.
func inRoot(p string) string {
	p = strings.TrimLeft(p, "/")
	if p == "" {
		return "."
	}
	return p
}

// openRootDir opens root itself, for the *at calls below.
func openRootDir(root string) (int, error) {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: root, Err: err}
	}
	return fd, nil
}

// openat2 is openat2(2) with RESOLVE_IN_ROOT, retried while the kernel
// asks (EAGAIN: a rename raced the lookup) or a signal interrupted it.
func openat2(dirfd int, p string, flags int, mode uint32) (int, error) {
	how := &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolveInRoot}
	var err error
	for range 16 {
		var fd int
		fd, err = unix.Openat2(dirfd, inRoot(p), how)
		if err == nil {
			return fd, nil
		}
		if err != unix.EAGAIN && err != unix.EINTR {
			break
		}
	}
	return -1, err
}

// openInRoot opens p inside root (see the comment above) as an *os.File.
func openInRoot(root, p string, flags int, mode uint32) (*os.File, error) {
	rfd, err := openRootDir(root)
	if err != nil {
		return nil, err
	}
	defer unix.Close(rfd)
	fd, err := openat2(rfd, p, flags, mode)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: p, Err: err}
	}
	return os.NewFile(uintptr(fd), p), nil
}

// statInRoot is stat(2) of p inside root, following its symlinks there.
func statInRoot(root, p string) (unix.Stat_t, error) {
	var st unix.Stat_t
	f, err := openInRoot(root, p, unix.O_PATH, 0)
	if err != nil {
		return st, err
	}
	defer f.Close()
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return st, &os.PathError{Op: "stat", Path: p, Err: err}
	}
	return st, nil
}

// splitFilePath splits an absolute file path into its directory and its
// last element, refusing a path that names no file ("/", "/a/..").
func splitFilePath(p string) (dir, base string, err error) {
	clean := path.Clean("/" + p)
	dir, base = path.Split(clean)
	if base == "" || base == "." || base == ".." {
		return "", "", fmt.Errorf("%s: not a file's path", p)
	}
	return dir, base, nil
}

// replaceInRoot writes a new file at p inside root: fill writes its
// content to a temporary file beside p, which then takes p's place
// (rename), so that a reader never sees half a file, and a symlink at p is
// replaced rather than followed. Only the directory is resolved (in the
// root); the temporary file is removed if anything fails.
func replaceInRoot(root, p string, mode uint32, fill func(*os.File) error) error {
	dir, base, err := splitFilePath(p)
	if err != nil {
		return err
	}
	d, err := openInRoot(root, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	return replaceAt(int(d.Fd()), p, base, mode, fill)
}

// replaceAt is replaceInRoot in the directory dirfd; p names the file in
// errors.
func replaceAt(dirfd int, p, base string, mode uint32, fill func(*os.File) error) error {
	var tmp string
	var fd int
	for range 8 {
		// Unique, not secret (O_EXCL refuses a name taken meanwhile), and
		// math/rand's: crypto/rand waits for the kernel's entropy pool,
		// which early in a boot under TCG takes seconds to fill.
		rnd := fmt.Sprintf("%012x", rand.Uint64()&(1<<48-1))
		tmp = "." + base + ".kairon-" + rnd
		if len(tmp) > 255 {
			tmp = ".kairon-" + rnd
		}
		var err error
		fd, err = unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == unix.EEXIST {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "create", Path: p, Err: err}
		}
		break
	}
	f := os.NewFile(uintptr(fd), p)
	done := false
	defer func() {
		if !done {
			f.Close()
			_ = unix.Unlinkat(dirfd, tmp, 0)
		}
	}()
	if err := fill(f); err != nil {
		return err
	}
	// The raw fchmod: os.FileMode has no raw setuid, setgid or sticky bits.
	if err := unix.Fchmod(int(f.Fd()), mode); err != nil {
		return &os.PathError{Op: "chmod", Path: p, Err: err}
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, base); err != nil {
		return &os.PathError{Op: "rename", Path: p, Err: err}
	}
	done = true
	return nil
}

// mkdirAllInRoot makes directory p inside root, and its parents, each
// resolved in the root as it is reached.
func mkdirAllInRoot(root, p string, mode uint32) error {
	rfd, err := openRootDir(root)
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	parent := "/"
	for _, elem := range strings.Split(strings.Trim(path.Clean("/"+p), "/"), "/") {
		if elem == "" {
			continue
		}
		cur := path.Join(parent, elem)
		fd, err := openat2(rfd, cur, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err == nil {
			unix.Close(fd)
			parent = cur
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return &os.PathError{Op: "mkdir", Path: cur, Err: err}
		}
		pfd, err := openat2(rfd, parent, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return &os.PathError{Op: "mkdir", Path: parent, Err: err}
		}
		err = unix.Mkdirat(pfd, elem, mode)
		unix.Close(pfd)
		if err != nil && err != unix.EEXIST {
			return &os.PathError{Op: "mkdir", Path: cur, Err: err}
		}
		parent = cur
	}
	return nil
}
