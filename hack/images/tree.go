package main

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

// tree is the file system of one image layer, by path relative to "/"
// ("usr/bin/qemu-system-x86_64"). writeTar turns it into a tar stream whose
// bytes depend only on the tree: sorted names, one fixed time, numeric
// owners and no names of users or groups of the build host.
type tree map[string]*entry

type entry struct {
	typ      byte // tar.TypeDir, TypeReg or TypeSymlink
	mode     int64
	uid, gid int
	link     string // symlink target
	src      string // regular file: its content on disk, or
	data     []byte // its content in memory
}

func cleanPath(p string) string {
	p = path.Clean("/" + p)
	return strings.TrimPrefix(p, "/")
}

func (t tree) dir(p string, mode int64, uid, gid int) {
	t[cleanPath(p)] = &entry{typ: tar.TypeDir, mode: mode, uid: uid, gid: gid}
}

func (t tree) file(p string, data []byte, mode int64) {
	t[cleanPath(p)] = &entry{typ: tar.TypeReg, mode: mode, data: data}
}

func (t tree) fileFrom(p, src string, mode int64) {
	t[cleanPath(p)] = &entry{typ: tar.TypeReg, mode: mode, src: src}
}

func (t tree) symlink(p, target string) {
	t[cleanPath(p)] = &entry{typ: tar.TypeSymlink, mode: 0o777, link: target}
}

// writeTar writes the tree as an uncompressed tar file at out, every entry
// dated mtime. Directories a path needs but the tree lacks are added as
// root's 0755.
func (t tree) writeTar(out string, mtime time.Time) error {
	for p := range t {
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := t[d]; !ok {
				t.dir(d, 0o755, 0, 0)
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

func (e *entry) write(tw *tar.Writer, name string, mtime time.Time) error {
	h := &tar.Header{
		Typeflag: e.typ, Name: name, Mode: e.mode, Uid: e.uid, Gid: e.gid,
		ModTime: mtime, Linkname: e.link, Format: tar.FormatPAX,
	}
	var r io.Reader
	switch e.typ {
	case tar.TypeDir:
		h.Name += "/"
	case tar.TypeReg:
		if e.src == "" {
			h.Size = int64(len(e.data))
			r = bytes.NewReader(e.data)
			break
		}
		sf, err := os.Open(e.src)
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
