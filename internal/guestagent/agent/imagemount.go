package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/zyvor/kairon/internal/imagefs"
)

// Mounting an image guest's image (kairon-guest-agent prepare-root
// --device, from the guest's init): the read-only filesystem the node made
// of the image (internal/imagefs), and over its rootfs/ an overlay whose
// writable layer is a tmpfs, in guest memory, so that a saved, cloned or
// migrated guest carries what it wrote and the image file stays as the
// node made it. Done here rather than by the init's shell: under TCG each
// program the init starts costs tens of milliseconds of boot.

// ImageMounts are where MountImage mounts an image, under one directory of
// the initramfs.
type ImageMounts struct {
	// RO is the image's filesystem, read-only.
	RO string
	// RW is the tmpfs holding the overlay's upper and work directories.
	RW string
	// Root is the overlay: the image's tree, writable.
	Root string
}

// ImageMountsUnder is the layout MountImage uses under dir: dir/ro, dir/rw,
// dir/root.
func ImageMountsUnder(dir string) ImageMounts {
	return ImageMounts{RO: filepath.Join(dir, "ro"), RW: filepath.Join(dir, "rw"), Root: filepath.Join(dir, "root")}
}

// Config is the image's config file in its filesystem.
func (m ImageMounts) Config() string { return filepath.Join(m.RO, imagefs.ConfigFile) }

// MountImage mounts the squashfs on device at m.RO and the overlay at
// m.Root. What it mounted is unmounted again if a later step fails.
func MountImage(device string, m ImageMounts) (err error) {
	var mounted []string
	defer func() {
		if err != nil {
			for i := len(mounted) - 1; i >= 0; i-- {
				_ = unix.Unmount(mounted[i], unix.MNT_DETACH)
			}
		}
	}()
	for _, d := range []string{m.RO, m.RW, m.Root} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount(device, m.RO, "squashfs", unix.MS_RDONLY|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("mounting %s (squashfs) at %s: %w", device, m.RO, err)
	}
	mounted = append(mounted, m.RO)
	lower := filepath.Join(m.RO, imagefs.RootDir)
	st, err := os.Lstat(lower)
	if err != nil || !st.IsDir() {
		return fmt.Errorf("the image on %s has no %s/ directory", device, imagefs.RootDir)
	}
	if fi, err := os.Lstat(m.Config()); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("the image on %s has no %s file", device, imagefs.ConfigFile)
	}
	if err := unix.Mount("tmpfs", m.RW, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mounting the writable layer's tmpfs at %s: %w", m.RW, err)
	}
	mounted = append(mounted, m.RW)
	upper, work := filepath.Join(m.RW, "upper"), filepath.Join(m.RW, "work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	// The overlay's root takes its owner and mode from the upper
	// directory: the image's, as its rootfs/ has them.
	sys := st.Sys().(*syscall.Stat_t)
	if err := os.Lchown(upper, int(sys.Uid), int(sys.Gid)); err != nil {
		return err
	}
	if err := unix.Chmod(upper, uint32(sys.Mode)&0o7777); err != nil {
		return err
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", m.Root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mounting the overlay at %s: %w", m.Root, err)
	}
	mounted = append(mounted, m.Root)
	return nil
}
