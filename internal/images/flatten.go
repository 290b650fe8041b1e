package images

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"sync"

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
	t, err := buildTree(layers, lim)
	if err != nil {
		return err
	}
	return writeTree(t, layers, config, lim, w)
}

// parallelScans is how many layers buildTree reads at once: reading a
// layer (decompressing, hashing) is most of its work, and layers are
// independent until they are applied, in order.
const parallelScans = 2

// scanned is a layer's entries (headers only), read and checked.
type scanned struct {
	entries []entry
	index   []int
	err     error
}

// buildTree reads every layer's headers, checks its diff ID, and applies
// the layers in order. Layers are read parallelScans at a time, and a
// layer's entries are kept only until it is applied.
func buildTree(layers []layerFile, lim flattenLimits) (*tree, error) {
	t := newTree(lim.maxNodes)
	read := &budget{limit: 2 * lim.maxBytes}
	read.left.Store(2 * lim.maxBytes)
	results := make([]chan scanned, len(layers))
	for i := range results {
		results[i] = make(chan scanned, 1)
	}
	slots := make(chan struct{}, parallelScans)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		// Slots are taken in layer order and given back once a layer is
		// applied, so that the layer applied next is always among those
		// being read.
		defer wg.Done()
		for n := range layers {
			select {
			case slots <- struct{}{}:
			case <-done:
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[n] <- scanHeaders(n, layers, lim, read)
			}()
		}
	}()
	defer func() {
		read.stop()
		close(done)
		wg.Wait()
	}()
	for n := range layers {
		r := <-results[n]
		if r.err != nil {
			return nil, r.err
		}
		if err := t.applyLayer(n, r.entries, r.index); err != nil {
			return nil, layerError(n+1, err)
		}
		if t.bytes > lim.maxBytes {
			return nil, tooLarge(t.bytes, n+1, len(layers), lim.maxBytes)
		}
		<-slots
	}
	return t, nil
}

// scanHeaders reads layer n's headers and checks its diff ID.
func scanHeaders(n int, layers []layerFile, lim flattenLimits, read *budget) scanned {
	var r scanned
	// What the layer's own files hold (the last entry of each path) is in
	// the tree once the layer is applied: a layer that alone holds too
	// much is refused at the header that tips it over, before its content
	// is decompressed.
	own, ownBytes := map[string]int64{}, int64(0)
	diffID, err := scanLayer(layers[n].path, read, func(i int, h *tar.Header, _ io.Reader) error {
		e, err := sanitize(h)
		if err != nil {
			return errInvalid{n + 1, err}
		}
		if e.kind == kindSkip {
			return nil
		}
		if int64(len(r.entries)) >= lim.maxNodes {
			return errLimit{fmt.Sprintf("a layer lists more than %d files", lim.maxNodes)}
		}
		r.entries, r.index = append(r.entries, e), append(r.index, i)
		if e.kind == kindReg || own[e.path] != 0 {
			ownBytes += e.size - own[e.path]
			own[e.path] = e.size
			if ownBytes > lim.maxBytes {
				return tooLarge(ownBytes, n+1, len(layers), lim.maxBytes)
			}
		}
		return nil
	})
	switch {
	case err != nil:
		r.err = layerError(n+1, err)
	case diffID != layers[n].diffID:
		r.err = errInvalid{n + 1, fmt.Errorf("its content's digest is %s, not the diff ID %s the image's config lists", diffID, layers[n].diffID)}
	}
	return r
}

// writeTree writes the tree as sqfstar's input: config.json, then the
// tree's directories, links and FIFOs, then the regular files' content,
// read again from the layers.
func writeTree(t *tree, layers []layerFile, config []byte, lim flattenLimits, w io.Writer) error {
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
			}
			pc.names = append(pc.names, name)
		}
		return nil
	})
	if err != nil {
		return err
	}
	reread := &budget{limit: 2 * lim.maxBytes}
	reread.left.Store(2 * lim.maxBytes)
	wantedIn := make([]int, len(layers))
	for k := range content {
		wantedIn[k[0]]++
	}
	for n, l := range layers {
		wanted := wantedIn[n]
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

func tooLarge(size int64, layer, layers int, limit int64) errLimit {
	return errLimit{fmt.Sprintf("its files hold at least %s uncompressed (by layer %d of %d), more than the node's limit of %s",
		humanBytes(size), layer, layers, humanBytes(limit))}
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
