package images

import (
	"archive/tar"
	"fmt"
	"path"
	"strings"
	"time"
)

// Bounds on what one tar header of a layer may hold. A layer is the
// user's, so untrusted: these keep the store's memory and the filesystem
// image within what Linux and squashfs take.
const (
	maxPathBytes      = 4096 // PATH_MAX
	maxNameBytes      = 255  // NAME_MAX
	maxLinkBytes      = 4095 // a symlink's target
	maxXattrNameBytes = 255
	maxXattrValue     = 64 << 10 // XATTR_SIZE_MAX
	maxXattrsPerFile  = 64 << 10 // all of one file's names and values
	maxID             = 1<<32 - 2
	maxMtime          = 1<<32 - 1 // squashfs keeps seconds in 32 bits
)

// kind is what a layer entry is, after sanitising.
type kind uint8

const (
	kindDir kind = iota + 1
	kindReg
	kindSymlink
	kindHardlink
	kindFifo
	kindWhiteout // removes path from the layers below
	kindOpaque   // hides what the layers below hold in directory path
	kindSkip     // carries nothing for the tree (a global PAX header, aufs metadata)
)

// meta is the part of a header the filesystem image keeps for a file.
type meta struct {
	mode     int64 // permission bits and setuid, setgid, sticky
	uid, gid int
	mtime    int64
	xattrs   map[string]string
}

// entry is one header of a layer, checked and normalised: what flattening
// works with. path is relative to the image's root, cleaned, "" for the
// root itself.
type entry struct {
	kind kind
	path string
	// link is a symlink's target, as written (the guest resolves it inside
	// the image), or a hard link's target path, cleaned like path.
	link string
	size int64
	meta meta
}

// whiteout prefixes, from the OCI image spec's layer format.
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
	whiteoutMeta   = ".wh..wh." // aufs' own files, meaningless here
)

// sanitize checks one header and returns what it means. An error names the
// path and the cause; the caller makes it an InvalidImage.
func sanitize(h *tar.Header) (entry, error) {
	var e entry
	if h.Typeflag == tar.TypeXGlobalHeader {
		// Global PAX records set defaults Go's reader already applied.
		e.kind = kindSkip
		return e, nil
	}
	p, err := cleanPath(h.Name)
	if err != nil {
		return e, err
	}
	e.path = p
	if strings.HasPrefix(p, whiteoutMeta) {
		// aufs' own directories at the root (.wh..wh.plnk, …) and what
		// they hold.
		e.kind = kindSkip
		return e, nil
	}
	base := path.Base(p)
	if strings.HasPrefix(base, whiteoutPrefix) {
		dir := path.Dir(p)
		if dir == "." {
			dir = ""
		}
		switch {
		case base == opaqueMarker:
			e.kind, e.path = kindOpaque, dir
		case strings.HasPrefix(base, whiteoutMeta):
			e.kind = kindSkip // aufs metadata elsewhere
		default:
			target := strings.TrimPrefix(base, whiteoutPrefix)
			if target == "" || target == "." || target == ".." {
				return e, fmt.Errorf("%q: a whiteout of nothing", h.Name)
			}
			e.kind, e.path = kindWhiteout, path.Join(dir, target)
		}
		return e, nil
	}
	e.meta, err = sanitizeMeta(h)
	if err != nil {
		return e, err
	}
	switch h.Typeflag {
	case tar.TypeDir:
		e.kind = kindDir
	case tar.TypeReg, tar.TypeRegA, tar.TypeCont, tar.TypeGNUSparse:
		if p == "" {
			return e, fmt.Errorf("%q: the image's root is not a directory", h.Name)
		}
		if h.Size < 0 {
			return e, fmt.Errorf("%q: negative size %d", h.Name, h.Size)
		}
		e.kind, e.size = kindReg, h.Size
	case tar.TypeSymlink:
		if p == "" {
			return e, fmt.Errorf("%q: the image's root is not a directory", h.Name)
		}
		if h.Linkname == "" || len(h.Linkname) > maxLinkBytes || strings.IndexByte(h.Linkname, 0) >= 0 {
			return e, fmt.Errorf("%q: symbolic link target of %d bytes is empty, longer than %d bytes or holds a NUL", h.Name, len(h.Linkname), maxLinkBytes)
		}
		// Xattrs on a symlink are rare and squashfs would need them in a
		// PAX header, where sqfstar 4.5.1 drops a link target's leading
		// slash: they are dropped.
		e.kind, e.link, e.meta.xattrs = kindSymlink, h.Linkname, nil
	case tar.TypeLink:
		if p == "" {
			return e, fmt.Errorf("%q: the image's root is not a directory", h.Name)
		}
		target, err := cleanPath(h.Linkname)
		if err != nil {
			return e, fmt.Errorf("hard link %q: target: %w", h.Name, err)
		}
		if target == "" {
			return e, fmt.Errorf("hard link %q: target is the image's root", h.Name)
		}
		e.kind, e.link = kindHardlink, target
	case tar.TypeFifo:
		if p == "" {
			return e, fmt.Errorf("%q: the image's root is not a directory", h.Name)
		}
		e.kind = kindFifo
	case tar.TypeChar, tar.TypeBlock:
		what := "character"
		if h.Typeflag == tar.TypeBlock {
			what = "block"
		}
		return e, fmt.Errorf("%q is a %s device node (%d, %d); images may not hold device nodes", h.Name, what, h.Devmajor, h.Devminor)
	default:
		return e, fmt.Errorf("%q: unsupported tar entry type %q", h.Name, h.Typeflag)
	}
	return e, nil
}

// cleanPath makes a tar name relative to the image's root: a leading "/"
// or "./" goes (tar's own convention), "a/../b" becomes "b", and a name
// that climbs above the root is refused rather than guessed at.
func cleanPath(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", fmt.Errorf("%q: path holds a NUL byte", name)
	}
	if len(name) > maxPathBytes {
		return "", fmt.Errorf("path of %d bytes is longer than %d", len(name), maxPathBytes)
	}
	p := path.Clean(strings.TrimLeft(name, "/"))
	if p == ".." || strings.HasPrefix(p, "../") {
		return "", fmt.Errorf("%q leaves the image's root", name)
	}
	if p == "." {
		return "", nil
	}
	for _, c := range strings.Split(p, "/") {
		if len(c) > maxNameBytes {
			return "", fmt.Errorf("%q: a path element is longer than %d bytes", name, maxNameBytes)
		}
	}
	return p, nil
}

// sanitizeMeta keeps the numeric owner, the permission and special bits,
// the modification time clamped to what squashfs keeps, and the extended
// attributes Linux namespaces squashfs stores, overlayfs' own excepted:
// the guest mounts the image under an overlay, which must not read the
// image's files as its own bookkeeping.
func sanitizeMeta(h *tar.Header) (meta, error) {
	m := meta{mode: h.Mode & 0o7777, uid: h.Uid, gid: h.Gid}
	if h.Uid < 0 || h.Uid > maxID || h.Gid < 0 || h.Gid > maxID {
		return m, fmt.Errorf("%q: owner %d:%d is out of range", h.Name, h.Uid, h.Gid)
	}
	if !h.ModTime.IsZero() {
		m.mtime = min(max(h.ModTime.Unix(), 0), maxMtime)
	}
	total := 0
	for k, v := range h.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok || !keptXattr(name) {
			continue
		}
		if len(name) > maxXattrNameBytes || len(v) > maxXattrValue {
			return m, fmt.Errorf("%q: extended attribute %.64q is larger than Linux allows", h.Name, name)
		}
		total += len(name) + len(v)
		if total > maxXattrsPerFile {
			return m, fmt.Errorf("%q: extended attributes of more than %d bytes", h.Name, maxXattrsPerFile)
		}
		if m.xattrs == nil {
			m.xattrs = map[string]string{}
		}
		m.xattrs[name] = v
	}
	return m, nil
}

func keptXattr(name string) bool {
	if strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, "user.overlay.") {
		return false
	}
	for _, ns := range []string{"user.", "trusted.", "security."} {
		if strings.HasPrefix(name, ns) && len(name) > len(ns) && strings.IndexByte(name, 0) < 0 {
			return true
		}
	}
	return false
}

// modTime is m's time for a tar header.
func (m meta) modTime() time.Time { return time.Unix(m.mtime, 0) }
