package images

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"

	"github.com/zyvor/kairon/internal/imagefs"
)

// errInvalid is a layer's content that the store refuses: the caller makes
// it an InvalidImage naming the layer.
type errInvalid struct {
	layer int // from 1
	err   error
}

func (e errInvalid) Error() string {
	if e.layer == 0 {
		return e.err.Error()
	}
	return fmt.Sprintf("layer %d: %v", e.layer, e.err)
}
func (e errInvalid) Unwrap() error { return e.err }

// flattenLimits bound one image's flattening.
type flattenLimits struct {
	maxBytes int64 // the flattened tree's regular files
	maxNodes int64 // files, directories and links in the tree
}

// flatten writes the image whose layers are given, bottom first, as one
// tar stream holding imagefs.ConfigFile (config) and imagefs.RootDir (the
// layers applied one over the other): the input of sqfstar. It reads the
// layers twice: once for their headers, to build the tree, and check the
// diff IDs; once for the content of the regular files that survived. Only
// what the tree says is written, each header rebuilt from the sanitised
// entry, so nothing of a layer's headers passes through unchecked.
func flatten(layers []layerFile, config []byte, lim flattenLimits, w io.Writer) error {
	t := newTree(lim.maxBytes, lim.maxNodes)
	read := &budget{left: 2 * lim.maxBytes, limit: 2 * lim.maxBytes}
	for n, l := range layers {
		var entries []entry
		var index []int
		diffID, err := scanLayer(l.path, read, func(i int, h *tar.Header, _ io.Reader) error {
			e, err := sanitize(h)
			if err != nil {
				return errInvalid{n + 1, err}
			}
			if e.kind == kindSkip {
				return nil
			}
			if int64(len(entries)) >= lim.maxNodes {
				return errLimit{fmt.Sprintf("a layer lists more than %d files", lim.maxNodes)}
			}
			entries, index = append(entries, e), append(index, i)
			return nil
		})
		if err != nil {
			return layerError(n+1, err)
		}
		if diffID != l.diffID {
			return errInvalid{n + 1, fmt.Errorf("its content's digest is %s, not the diff ID %s the image's config lists", diffID, l.diffID)}
		}
		if err := t.applyLayer(n, entries, index); err != nil {
			return layerError(n+1, err)
		}
		if t.bytes > lim.maxBytes {
			return errLimit{fmt.Sprintf("its files hold at least %s uncompressed (after layer %d of %d), more than the node's limit of %s",
				humanBytes(t.bytes), n+1, len(layers), humanBytes(lim.maxBytes))}
		}
	}

	tw := tar.NewWriter(outputWriter{w})
	if err := tw.WriteHeader(&tar.Header{Name: imagefs.ConfigFile, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(config)), Format: tar.FormatGNU}); err != nil {
		return err
	}
	if _, err := tw.Write(config); err != nil {
		return err
	}
	// Everything but regular files' content comes from the tree, in path
	// order; the content then comes layer by layer, in the order each
	// layer holds it. A file's first name (in path order) carries its
	// content, the others are hard links to it, written right after.
	type pending struct {
		n     *node
		names []string
	}
	content := map[[2]int]*pending{}
	var order []*pending
	err := t.visit(func(p string, n *node) error {
		name := path.Join(imagefs.RootDir, p)
		if len(name) > maxPathBytes {
			return errInvalid{0, fmt.Errorf("%q: longer than %d bytes once symbolic links are followed", p, maxPathBytes)}
		}
		switch n.kind {
		case kindDir:
			return tw.WriteHeader(header(name+"/", tar.TypeDir, n))
		case kindSymlink:
			h := header(name, tar.TypeSymlink, n)
			h.Linkname = n.link
			return tw.WriteHeader(h)
		case kindFifo:
			return tw.WriteHeader(header(name, tar.TypeFifo, n))
		case kindReg:
			key := [2]int{n.inode.layer, n.inode.index}
			pc := content[key]
			if pc == nil {
				pc = &pending{n: n}
				content[key] = pc
				order = append(order, pc)
			}
			pc.names = append(pc.names, name)
		}
		return nil
	})
	if err != nil {
		return err
	}
	reread := &budget{left: 2 * lim.maxBytes, limit: 2 * lim.maxBytes}
	for n, l := range layers {
		wanted := 0
		for k := range content {
			if k[0] == n {
				wanted++
			}
		}
		if wanted == 0 {
			continue
		}
		written := 0
		_, err := scanLayer(l.path, reread, func(i int, _ *tar.Header, r io.Reader) error {
			pc := content[[2]int{n, i}]
			if pc == nil {
				return nil
			}
			h := header(pc.names[0], tar.TypeReg, pc.n)
			h.Size = pc.n.inode.size
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if _, err := io.CopyN(tw, r, h.Size); err != nil {
				return fmt.Errorf("%s: %w", pc.names[0], err)
			}
			for _, other := range pc.names[1:] {
				hl := header(other, tar.TypeLink, pc.n)
				hl.Linkname = pc.names[0]
				if err := tw.WriteHeader(hl); err != nil {
					return err
				}
			}
			written++
			return nil
		})
		if err != nil {
			return layerError(n+1, err)
		}
		if written != wanted {
			return fmt.Errorf("layer %d: %d of its %d files were not found again", n+1, wanted-written, wanted)
		}
	}
	return tw.Close()
}

// header is a tar header for a node, made from its sanitised metadata
// alone. GNU format unless the node has extended attributes, which need
// PAX: sqfstar 4.5.1 reads a PAX linkpath without its leading slash, and
// a symlink never carries extended attributes here.
func header(name string, typ byte, n *node) *tar.Header {
	h := &tar.Header{
		Name:     name,
		Typeflag: typ,
		Mode:     n.meta.mode,
		Uid:      n.meta.uid,
		Gid:      n.meta.gid,
		ModTime:  n.meta.modTime(),
		Format:   tar.FormatGNU,
	}
	if len(n.meta.xattrs) > 0 && typ != tar.TypeSymlink {
		h.Format = tar.FormatPAX
		h.PAXRecords = make(map[string]string, len(n.meta.xattrs))
		for k, v := range n.meta.xattrs {
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
	}
	return h
}

// layerError keeps a limit, an invalid entry and a failed output as they
// are and names the layer in anything else its reading met (a corrupt
// compressed stream, a malformed tar header): content the store cannot
// use.
func layerError(layer int, err error) error {
	var lim errLimit
	var inv errInvalid
	var out errOutput
	if errors.As(err, &lim) || errors.As(err, &inv) || errors.As(err, &out) {
		return err
	}
	return errInvalid{layer, err}
}

// errOutput is a failure to write the flattened stream (sqfstar exited,
// the disk is full): the node's trouble, not the image's.
type errOutput struct{ err error }

func (e errOutput) Error() string { return "writing the filesystem image: " + e.err.Error() }
func (e errOutput) Unwrap() error { return e.err }

type outputWriter struct{ w io.Writer }

func (o outputWriter) Write(p []byte) (int, error) {
	n, err := o.w.Write(p)
	if err != nil {
		err = errOutput{err}
	}
	return n, err
}
