package qemu

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"syscall"
)

// An image guest's root image (backend.Spec.RootImage): an OCI image the
// node converted into one read-only filesystem (internal/imagefs), which
// the guest mounts under an overlay in its memory (hack/guest/init). QEMU
// attaches it as a disk; a saved or migrating image guest's state names
// the image's SHA-256, and its target must attach the very same bytes:
// the guest's page cache holds blocks of the image, and its filesystem
// driver trusts what it read, so another image (even the same digest
// converted differently) is refused rather than corrupting the guest.

// rootImageDevice is the name the guest's kernel gives the root image's
// disk (the only one), which kairon.image tells its init.
const rootImageDevice = "vda"

// rootImageFDSet is the QEMU descriptor set holding a jailed QEMU's root
// image.
const rootImageFDSet = 1

// rootImageArgs attaches an image guest's root image (internal/imagefs) as
// a read-only raw disk on a virtio-blk device of the microvm's
// virtio-mmio bus. It comes after every other device, so theirs keep
// their transports, and its properties are fixed: a saved or migrating
// VM's target gets the same device. A jailed QEMU (fd > 0) takes the file
// through a descriptor set rather than a path, which it could neither
// search for nor reopen from its chroot; QEMU dups the descriptor
// whenever its block layer opens the file.
func rootImageArgs(path string, fd int) []string {
	var a []string
	file := qemuOpt(path)
	if fd > 0 {
		set := strconv.Itoa(rootImageFDSet)
		a = append(a, "-add-fd", "fd="+strconv.Itoa(fd)+",set="+set+",opaque=root-image")
		file = "/dev/fdset/" + set
	}
	return append(a,
		"-drive", "if=none,id=rootimg,format=raw,read-only=on,file="+file,
		"-device", "virtio-blk-device,drive=rootimg")
}

// rootImageSums caches the SHA-256 of root images by what identifies one
// file's content on the node (device, inode, size, modification time):
// the node's images are written once and never changed, and one is hashed
// once however many of its VMs are saved or migrated.
var rootImageSums sync.Map // rootImageKey -> string

type rootImageKey struct {
	dev, ino    uint64
	size, mtime int64
}

// rootImageSum is the SHA-256 (hex) of the root image at path.
func rootImageSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("root image: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("root image: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "", fmt.Errorf("root image %s: no file identity", path)
	}
	key := rootImageKey{dev: st.Dev, ino: st.Ino, size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if sum, ok := rootImageSums.Load(key); ok {
		return sum.(string), nil
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("root image %s: %w", path, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	rootImageSums.Store(key, sum)
	return sum, nil
}
