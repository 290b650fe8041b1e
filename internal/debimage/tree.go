package debimage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// Tree is the file system of one image layer, by path relative to "/"
// ("usr/bin/qemu-system-x86_64"). WriteTar turns it into a tar stream whose
// bytes depend only on the tree: sorted names, one fixed time, numeric
// owners and no names of users or groups of the build host.
type Tree map[string]*Entry

// Entry is one file, directory or symlink of a Tree.
type Entry struct {
	Type     byte // tar.TypeDir, TypeReg or TypeSymlink
	Mode     int64
	UID, GID int
	Link     string // symlink target
	Src      string // regular file: its content on disk, or
	Data     []byte // its content in memory
}

// CleanPath is p as a Tree key: cleaned, relative to "/", "" for "/".
func CleanPath(p string) string {
	p = path.Clean("/" + p)
	return strings.TrimPrefix(p, "/")
}

// Dir adds a directory.
func (t Tree) Dir(p string, mode int64, uid, gid int) {
	t[CleanPath(p)] = &Entry{Type: tar.TypeDir, Mode: mode, UID: uid, GID: gid}
}

// File adds a regular file of root's holding data.
func (t Tree) File(p string, data []byte, mode int64) {
	t[CleanPath(p)] = &Entry{Type: tar.TypeReg, Mode: mode, Data: data}
}

// FileFrom adds a regular file of root's whose content is the file src.
func (t Tree) FileFrom(p, src string, mode int64) {
	t[CleanPath(p)] = &Entry{Type: tar.TypeReg, Mode: mode, Src: src}
}

// Symlink adds a symbolic link to target.
func (t Tree) Symlink(p, target string) {
	t[CleanPath(p)] = &Entry{Type: tar.TypeSymlink, Mode: 0o777, Link: target}
}

// Read returns the content of the regular file at p.
func (t Tree) Read(p string) ([]byte, error) {
	e, ok := t[CleanPath(p)]
	if !ok {
		return nil, fmt.Errorf("/%s: not in the image", CleanPath(p))
	}
	if e.Type != tar.TypeReg {
		return nil, fmt.Errorf("/%s: not a regular file", CleanPath(p))
	}
	if e.Src == "" {
		return e.Data, nil
	}
	return os.ReadFile(e.Src)
}

// CopyFile makes to a regular file of root's with from's content and
// mode, as `cp -p` would.
func (t Tree) CopyFile(from, to string) error {
	e, ok := t[CleanPath(from)]
	if !ok || e.Type != tar.TypeReg {
		return fmt.Errorf("/%s: no such regular file in the image", CleanPath(from))
	}
	c := *e
	t[CleanPath(to)] = &c
	return nil
}

// WriteTar writes the tree as an uncompressed tar file at out, every entry
// dated mtime. Directories a path needs but the tree lacks are added as
// root's 0755.
func (t Tree) WriteTar(out string, mtime time.Time) error {
	for p := range t {
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := t[d]; !ok {
				t.Dir(d, 0o755, 0, 0)
			}
		}
	}
	names := make([]string, 0, len(t))
	for p := range t {
		if p != "" {
			names = append(names, p)
		}
	}
	sort.Strings(names)
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	for _, p := range names {
		if err := t[p].write(tw, p, mtime); err != nil {
			f.Close()
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (e *Entry) write(tw *tar.Writer, name string, mtime time.Time) error {
	h := &tar.Header{
		Typeflag: e.Type, Name: name, Mode: e.Mode, Uid: e.UID, Gid: e.GID,
		ModTime: mtime, Linkname: e.Link, Format: tar.FormatPAX,
	}
	var r io.Reader
	switch e.Type {
	case tar.TypeDir:
		h.Name += "/"
	case tar.TypeReg:
		if e.Src == "" {
			h.Size = int64(len(e.Data))
			r = bytes.NewReader(e.Data)
			break
		}
		sf, err := os.Open(e.Src)
		if err != nil {
			return err
		}
		defer sf.Close()
		st, err := sf.Stat()
		if err != nil {
			return err
		}
		h.Size = st.Size()
		r = sf
	}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	if r != nil {
		_, err := io.Copy(tw, r)
		return err
	}
	return nil
}
