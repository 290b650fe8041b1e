package agent

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"

	"golang.org/x/sys/unix"
)

// Preparing an image guest's root, once per boot, before anything runs in
// it (kairon-guest-agent prepare-root, from the guest's init, which has
// mounted the image and the overlay at the root already): the kernel's
// filesystems mounted inside it, /tmp, the image's working directory, and
// the identity files (identity.go). The image decides what its tree holds,
// so a mount point that is a symlink or a file there is replaced by a
// directory, and every mount goes through a descriptor of the directory
// the root really has (never a path a symlink could redirect out of it).

// RootSetup is what PrepareRoot prepares.
type RootSetup struct {
	// Root is the image's root (the overlay).
	Root string
	// Identity is written to the root's /etc.
	Identity GuestIdentity
	// WorkingDir is made if the image lacks it (as a container runtime
	// does), so its main process and exec can start there.
	WorkingDir string
}

// rootMount is one filesystem mounted inside the root. The source of a
// bind mount is a path of the initramfs.
type rootMount struct {
	target, fstype, source string
	flags                  uintptr
	data                   string
}

// rootMounts are mounted in order: dev/pts and dev/shm are in the devtmpfs
// mounted at dev. dev/pts is the initramfs's own devpts, so that a
// terminal the agent opens for an exec (/dev/ptmx of the initramfs) has
// the same name inside the root.
var rootMounts = []rootMount{
	{target: "proc", fstype: "proc", source: "proc", flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
	{target: "sys", fstype: "sysfs", source: "sysfs", flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
	{target: "dev", fstype: "devtmpfs", source: "devtmpfs", flags: unix.MS_NOSUID, data: "mode=0755"},
	{target: "dev/pts", source: "/dev/pts", flags: unix.MS_BIND},
	{target: "dev/shm", fstype: "tmpfs", source: "shm", flags: unix.MS_NOSUID | unix.MS_NODEV, data: "mode=1777"},
	{target: "run", fstype: "tmpfs", source: "tmpfs", flags: unix.MS_NOSUID | unix.MS_NODEV, data: "mode=0755"},
}

// PrepareRoot prepares s.Root. It stops at the first mount that fails (a
// root without its /proc or /dev is no place to run anything), and
// reports the rest together.
func PrepareRoot(s RootSetup) error {
	for _, m := range rootMounts {
		if err := mountInRoot(s.Root, m); err != nil {
			return err
		}
	}
	var errs []error
	if err := makeTmp(s.Root); err != nil {
		errs = append(errs, err)
	}
	if wd := s.WorkingDir; wd != "" && path.IsAbs(wd) && path.Clean(wd) != "/" {
		if err := mkdirAllInRoot(s.Root, wd, 0o755); err != nil {
			errs = append(errs, fmt.Errorf("working directory: %w", err))
		}
	}
	if err := WriteIdentity(s.Root, s.Identity); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// mountInRoot mounts m at its target inside root. A top-level target is
// made a real directory first; one below (in the devtmpfs just mounted)
// is made if missing. The mount goes through /proc/self/fd of the target
// opened without following any symlink.
func mountInRoot(root string, m rootMount) error {
	dir, base := path.Split(m.target)
	if dir == "" {
		if err := ensureDirAt(root, base, 0o755); err != nil {
			return fmt.Errorf("mount point /%s: %w", m.target, err)
		}
	} else if err := mkdirAllInRoot(root, m.target, 0o755); err != nil {
		return fmt.Errorf("mount point /%s: %w", m.target, err)
	}
	rfd, err := openRootDir(root)
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS}
	fd, err := unix.Openat2(rfd, m.target, how)
	if err != nil {
		return fmt.Errorf("mount point /%s: %w", m.target, err)
	}
	defer unix.Close(fd)
	target := "/proc/self/fd/" + strconv.Itoa(fd)
	if err := unix.Mount(m.source, target, m.fstype, m.flags, m.data); err != nil {
		what := m.fstype
		if what == "" {
			what = m.source
		}
		return fmt.Errorf("mounting %s at /%s in the image: %w", what, m.target, &os.SyscallError{Syscall: "mount", Err: err})
	}
	return nil
}

// makeTmp makes sure the image has a /tmp anyone may write to (mode
// 1777), following a symlink there (to /var/tmp, say) inside the root.
func makeTmp(root string) error {
	f, err := openInRoot(root, "/tmp", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if errors.Is(err, unix.ENOENT) {
		if err := ensureDirAt(root, "tmp", 0o1777); err != nil {
			return fmt.Errorf("/tmp: %w", err)
		}
		f, err = openInRoot(root, "/tmp", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	}
	if err != nil {
		return fmt.Errorf("/tmp: %w", err)
	}
	defer f.Close()
	if err := unix.Fchmod(int(f.Fd()), 0o1777); err != nil {
		return fmt.Errorf("/tmp: chmod: %w", err)
	}
	return nil
}
