package images

import (
	"archive/tar"
	"strings"
	"testing"
	"time"
)

func TestSanitize(t *testing.T) {
	for _, tc := range []struct {
		name    string
		h       tar.Header
		want    entry
		wantErr string
	}{
		{name: "regular file, leading ./", h: tar.Header{Name: "./usr/bin/tool", Typeflag: tar.TypeReg, Mode: 0o104755, Uid: 1000, Gid: 1001, Size: 5, ModTime: time.Unix(7, 0)},
			want: entry{kind: kindReg, path: "usr/bin/tool", size: 5, meta: meta{mode: 0o4755, uid: 1000, gid: 1001, mtime: 7}}},
		{name: "absolute path is made relative", h: tar.Header{Name: "/etc/passwd", Typeflag: tar.TypeReg},
			want: entry{kind: kindReg, path: "etc/passwd"}},
		{name: "dot-dot inside is cleaned", h: tar.Header{Name: "a/../b", Typeflag: tar.TypeDir, Mode: 0o1777},
			want: entry{kind: kindDir, path: "b", meta: meta{mode: 0o1777}}},
		{name: "root directory", h: tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
			want: entry{kind: kindDir, path: "", meta: meta{mode: 0o755}}},
		{name: "escaping path", h: tar.Header{Name: "../../etc/shadow", Typeflag: tar.TypeReg}, wantErr: `"../../etc/shadow" leaves the image's root`},
		{name: "escaping path after cleaning", h: tar.Header{Name: "a/../../x", Typeflag: tar.TypeReg}, wantErr: "leaves the image's root"},
		{name: "NUL in name", h: tar.Header{Name: "a\x00b", Typeflag: tar.TypeReg}, wantErr: "NUL"},
		{name: "long element", h: tar.Header{Name: strings.Repeat("x", 256), Typeflag: tar.TypeReg}, wantErr: "longer than 255"},
		{name: "long path", h: tar.Header{Name: strings.Repeat("x/", 2049), Typeflag: tar.TypeReg}, wantErr: "longer than 4096"},
		{name: "char device", h: tar.Header{Name: "dev/null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}, wantErr: `"dev/null" is a character device node (1, 3)`},
		{name: "block device", h: tar.Header{Name: "dev/sda", Typeflag: tar.TypeBlock, Devmajor: 8}, wantErr: "block device node"},
		{name: "unknown type", h: tar.Header{Name: "x", Typeflag: 'V'}, wantErr: "unsupported tar entry type"},
		{name: "negative size", h: tar.Header{Name: "x", Typeflag: tar.TypeReg, Size: -1}, wantErr: "negative size"},
		{name: "negative uid", h: tar.Header{Name: "x", Typeflag: tar.TypeReg, Uid: -1}, wantErr: "out of range"},
		{name: "huge gid", h: tar.Header{Name: "x", Typeflag: tar.TypeReg, Gid: 1 << 40}, wantErr: "out of range"},
		{name: "mtime clamped", h: tar.Header{Name: "x", Typeflag: tar.TypeReg, ModTime: time.Unix(1<<40, 0)},
			want: entry{kind: kindReg, path: "x", meta: meta{mtime: maxMtime}}},
		{name: "mtime before 1970", h: tar.Header{Name: "x", Typeflag: tar.TypeReg, ModTime: time.Unix(-5, 0)},
			want: entry{kind: kindReg, path: "x"}},
		{name: "symlink kept as written", h: tar.Header{Name: "bin", Typeflag: tar.TypeSymlink, Linkname: "/usr/bin"},
			want: entry{kind: kindSymlink, path: "bin", link: "/usr/bin"}},
		{name: "symlink leaving the root is the guest's business", h: tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../../../../etc"},
			want: entry{kind: kindSymlink, path: "l", link: "../../../../etc"}},
		{name: "empty symlink", h: tar.Header{Name: "l", Typeflag: tar.TypeSymlink}, wantErr: "symbolic link target"},
		{name: "symlink drops xattrs", h: tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "x", PAXRecords: map[string]string{"SCHILY.xattr.user.a": "b"}},
			want: entry{kind: kindSymlink, path: "l", link: "x"}},
		{name: "hard link", h: tar.Header{Name: "b", Typeflag: tar.TypeLink, Linkname: "/a"},
			want: entry{kind: kindHardlink, path: "b", link: "a"}},
		{name: "hard link escaping", h: tar.Header{Name: "b", Typeflag: tar.TypeLink, Linkname: "../etc/shadow"}, wantErr: `hard link "b": target: "../etc/shadow" leaves the image's root`},
		{name: "hard link to root", h: tar.Header{Name: "b", Typeflag: tar.TypeLink, Linkname: "./"}, wantErr: "target is the image's root"},
		{name: "file at the root", h: tar.Header{Name: "/", Typeflag: tar.TypeReg}, wantErr: "root is not a directory"},
		{name: "fifo", h: tar.Header{Name: "run/fifo", Typeflag: tar.TypeFifo, Mode: 0o600},
			want: entry{kind: kindFifo, path: "run/fifo", meta: meta{mode: 0o600}}},
		{name: "whiteout", h: tar.Header{Name: "etc/.wh.motd", Typeflag: tar.TypeReg},
			want: entry{kind: kindWhiteout, path: "etc/motd"}},
		{name: "whiteout at root", h: tar.Header{Name: ".wh.opt", Typeflag: tar.TypeReg},
			want: entry{kind: kindWhiteout, path: "opt"}},
		{name: "opaque", h: tar.Header{Name: "var/cache/.wh..wh..opq", Typeflag: tar.TypeReg},
			want: entry{kind: kindOpaque, path: "var/cache"}},
		{name: "aufs metadata", h: tar.Header{Name: ".wh..wh.plnk/1.2", Typeflag: tar.TypeReg}, want: entry{kind: kindSkip, path: ".wh..wh.plnk/1.2"}},
		{name: "whiteout of dot-dot", h: tar.Header{Name: "a/.wh...", Typeflag: tar.TypeReg}, wantErr: "whiteout of nothing"},
		{name: "global header", h: tar.Header{Typeflag: tar.TypeXGlobalHeader}, want: entry{kind: kindSkip}},
		{name: "xattrs filtered", h: tar.Header{Name: "x", Typeflag: tar.TypeReg, PAXRecords: map[string]string{
			"SCHILY.xattr.user.mime":               "text/plain",
			"SCHILY.xattr.security.capability":     "\x01\x00",
			"SCHILY.xattr.trusted.overlay.opaque":  "y",
			"SCHILY.xattr.user.overlay.redirect":   "/x",
			"SCHILY.xattr.system.posix_acl_access": "acl",
			"SCHILY.xattr.user.":                   "empty name",
			"LIBARCHIVE.xattr.user.other":          "dA==",
			"comment":                              "ignored"}},
			want: entry{kind: kindReg, path: "x", meta: meta{xattrs: map[string]string{"user.mime": "text/plain", "security.capability": "\x01\x00"}}}},
		{name: "xattr value too large", h: tar.Header{Name: "x", Typeflag: tar.TypeReg, PAXRecords: map[string]string{"SCHILY.xattr.user.big": strings.Repeat("v", maxXattrValue+1)}}, wantErr: "larger than Linux allows"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := sanitize(&tc.h)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("sanitize(%+v) = %+v, %v; want an error containing %q", tc.h, got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("sanitize: %v", err)
			}
			if got.kind != tc.want.kind || got.path != tc.want.path || got.link != tc.want.link || got.size != tc.want.size ||
				got.meta.mode != tc.want.meta.mode || got.meta.uid != tc.want.meta.uid || got.meta.gid != tc.want.meta.gid ||
				got.meta.mtime != tc.want.meta.mtime || !sameXattrs(got.meta.xattrs, tc.want.meta.xattrs) {
				t.Fatalf("sanitize = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func sameXattrs(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
