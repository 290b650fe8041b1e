package images

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzFlatten feeds two arbitrary byte strings to the flattener as the
// uncompressed layers of an image: it must refuse them (as an invalid or
// too large image) or write a tar stream that holds config.json and, under
// rootfs/, only clean paths whose parents come first, only directories,
// files, symbolic links, FIFOs and hard links to files written before it,
// within the size limit, and no extended attribute it does not keep.
func FuzzFlatten(f *testing.F) {
	seeds := [][2][]byte{
		{tarOf(f, file{name: "etc/", typ: tar.TypeDir}, file{name: "etc/passwd", body: "root:x:0:0"}, file{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"}),
			tarOf(f, file{name: "etc/.wh.passwd"}, file{name: "bin/sh", body: "#!", mode: 0o4755}, file{name: "usr/.wh..wh..opq"})},
		{tarOf(f, file{name: "a", body: "x"}, file{name: "b", typ: tar.TypeLink, link: "a"}, file{name: "p", typ: tar.TypeFifo}),
			tarOf(f, file{name: "a", body: "yy"}, file{name: "c", typ: tar.TypeLink, link: "b"})},
		{tarOf(f, file{name: strings.Repeat("long/", 60) + "name", body: "deep"}, file{name: "x", xattrs: map[string]string{"user.a": "b", "trusted.overlay.opaque": "y"}}),
			tarOf(f, file{name: "l", typ: tar.TypeSymlink, link: "/" + strings.Repeat("t", 300)})},
		{tarOf(f, file{name: "../escape", body: "no"}), nil},
		{tarOf(f, file{name: "dev/null", typ: tar.TypeChar, dev: [2]int64{1, 3}}), nil},
		{tarOf(f, file{name: "loop", typ: tar.TypeSymlink, link: "loop"}, file{name: "loop/x"}), nil},
		{tarOf(f, file{name: "up", typ: tar.TypeSymlink, link: "../../.."}, file{name: "up/etc/shadow", body: "s"}), nil},
		{[]byte("not a tar at all"), nil},
		{truncated(tarOf(f, file{name: "big", body: strings.Repeat("z", 2048)})), nil},
		{hugeHeader(f), nil},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, l1, l2 []byte) {
		dir := t.TempDir()
		var layers []layerFile
		for i, b := range [][]byte{l1, l2} {
			if b == nil {
				continue
			}
			p := filepath.Join(dir, string(rune('a'+i)))
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(b)
			layers = append(layers, layerFile{path: p, diffID: "sha256:" + hex.EncodeToString(sum[:])})
		}
		const maxBytes = 1 << 20
		var out bytes.Buffer
		err := flatten(layers, []byte("{}"), flattenLimits{maxBytes: maxBytes, maxNodes: 2000}, &out)
		if err != nil {
			var lim errLimit
			var inv errInvalid
			if !errors.As(err, &lim) && !errors.As(err, &inv) {
				t.Fatalf("flatten failed with neither an invalid image nor a limit: %v", err)
			}
			return
		}
		checkFlattened(t, out.Bytes(), maxBytes)
	})
}

func checkFlattened(t *testing.T, b []byte, maxBytes int64) {
	tr := tar.NewReader(bytes.NewReader(b))
	seen := map[string]byte{}
	var total int64
	for i := 0; ; i++ {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the output is not a tar: %v", err)
		}
		if i == 0 {
			if h.Name != "config.json" || h.Typeflag != tar.TypeReg {
				t.Fatalf("first entry %q, want config.json", h.Name)
			}
			continue
		}
		name := strings.TrimSuffix(h.Name, "/")
		if name != "rootfs" && !strings.HasPrefix(name, "rootfs/") {
			t.Fatalf("%q is outside rootfs/", h.Name)
		}
		if path.Clean(name) != name || strings.Contains("/"+name+"/", "/../") {
			t.Fatalf("%q is not a clean path", h.Name)
		}
		if _, dup := seen[name]; dup {
			t.Fatalf("%q written twice", h.Name)
		}
		if name != "rootfs" && seen[path.Dir(name)] != tar.TypeDir {
			t.Fatalf("%q comes before its directory", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir, tar.TypeSymlink, tar.TypeFifo:
		case tar.TypeReg:
			total += h.Size
		case tar.TypeLink:
			if seen[h.Linkname] != tar.TypeReg {
				t.Fatalf("hard link %q to %q, which is not a file written before", h.Name, h.Linkname)
			}
		default:
			t.Fatalf("%q has type %q", h.Name, h.Typeflag)
		}
		for k := range h.PAXRecords {
			if x, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok && !keptXattr(x) {
				t.Fatalf("%q carries extended attribute %q", h.Name, x)
			}
		}
		if h.Mode&^0o7777 != 0 || h.Uid < 0 || h.Gid < 0 {
			t.Fatalf("%q: mode %o, owner %d:%d", h.Name, h.Mode, h.Uid, h.Gid)
		}
		seen[name] = h.Typeflag
	}
	if total > maxBytes {
		t.Fatalf("%d bytes of files, limit %d", total, maxBytes)
	}
}

// truncated cuts a tar in the middle of a file's content.
func truncated(b []byte) []byte { return b[:512+100] }

// hugeHeader is a tar whose one file claims an exabyte.
func hugeHeader(f *testing.F) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "huge", Typeflag: tar.TypeReg, Size: 1 << 60, Mode: 0o644}); err != nil {
		f.Fatal(err)
	}
	_, _ = tw.Write(make([]byte, 4096))
	return buf.Bytes()
}
