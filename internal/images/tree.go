package images

import (
	"fmt"
	"path"
	"sort"
	"strings"
)

// maxSymlinkHops bounds following symbolic links while placing an entry,
// as Linux's ELOOP does (40). maxDepth bounds how deep directories nest:
// entries placed through symbolic links could otherwise nest them deeper
// with every entry.
const (
	maxSymlinkHops = 40
	maxDepth       = 512
)

// tree is an image's filesystem as its layers build it, applied one after
// the other, without the files' content: where each regular file's bytes
// are (which layer, which entry) is all it keeps of them. Flattening reads
// the layers once to build it, then once more to copy the content of what
// survived.
type tree struct {
	root *node
	// bytes is the content of the regular files in the tree now, each
	// inode counted once; nodes is how many nodes it has.
	bytes, nodes int64
	// limits; exceeding one is an errLimit.
	maxBytes, maxNodes int64
}

// node is a file in the tree.
type node struct {
	kind     kind // kindDir, kindReg, kindSymlink or kindFifo
	meta     meta
	link     string           // a symlink's target
	inode    *inode           // a regular file's content, shared by its hard links
	children map[string]*node // a directory's entries
}

// inode is a regular file's content: entry index of layer, and how many
// names it has in the tree now.
type inode struct {
	layer, index int
	size         int64
	nlink        int
}

// errLimit is a tree that outgrew its bytes or nodes: the image is too
// large rather than malformed.
type errLimit struct{ what string }

func (e errLimit) Error() string { return e.what }

func newTree(maxBytes, maxNodes int64) *tree {
	return &tree{
		root:     &node{kind: kindDir, meta: meta{mode: 0o755}, children: map[string]*node{}},
		maxBytes: maxBytes,
		maxNodes: maxNodes,
	}
}

// applyLayer applies one layer's entries, in the order the layer lists
// them: first its whiteouts and opaque markers, which the OCI image spec
// applies to the layers below only, then everything it adds. index is each
// entry's position in the layer, kept so that its content can be found
// again.
func (t *tree) applyLayer(layer int, entries []entry, index []int) error {
	for _, e := range entries {
		switch e.kind {
		case kindOpaque:
			if n, err := t.lookup(e.path); err == nil && n.kind == kindDir {
				for name, c := range n.children {
					t.release(c)
					delete(n.children, name)
				}
			}
		case kindWhiteout:
			dir, base, err := t.walk(e.path, false)
			if err != nil {
				continue // nothing below to hide
			}
			if c, ok := dir.children[base]; ok {
				t.release(c)
				delete(dir.children, base)
			}
		}
	}
	for i, e := range entries {
		switch e.kind {
		case kindOpaque, kindWhiteout, kindSkip:
			continue
		}
		if err := t.add(layer, index[i], e); err != nil {
			return err
		}
	}
	return nil
}

// add places one entry, replacing what was at its path (a directory over
// a directory only takes its metadata, as extracting a tar does).
func (t *tree) add(layer, index int, e entry) error {
	if e.path == "" {
		if e.kind == kindDir {
			t.root.meta = e.meta
			return nil
		}
		return fmt.Errorf("%q: the image's root is not a directory", "/")
	}
	var target *node
	if e.kind == kindHardlink {
		var err error
		target, err = t.lookup(e.link)
		if err != nil || (target.kind != kindReg && target.kind != kindSymlink && target.kind != kindFifo) {
			return fmt.Errorf("hard link %q: its target %q is not a file earlier in the image", e.path, e.link)
		}
	}
	dir, base, err := t.walk(e.path, true)
	if err != nil {
		return err
	}
	old := dir.children[base]
	if e.kind == kindDir && old != nil && old.kind == kindDir {
		old.meta = e.meta
		return nil
	}
	if old != nil && old == target {
		return nil // a hard link to itself
	}
	n := &node{kind: e.kind, meta: e.meta}
	switch e.kind {
	case kindDir:
		n.children = map[string]*node{}
	case kindReg:
		n.inode = &inode{layer: layer, index: index, size: e.size}
	case kindSymlink:
		n.link = e.link
	case kindHardlink:
		// A hard link is its target's inode under one more name; a link to
		// a symlink or a FIFO (rare) becomes a copy of it.
		n.kind, n.meta, n.inode, n.link = target.kind, target.meta, target.inode, target.link
	}
	if old != nil {
		t.release(old)
	}
	if err := t.hold(n); err != nil {
		return err
	}
	dir.children[base] = n
	return nil
}

// hold counts a node that joins the tree.
func (t *tree) hold(n *node) error {
	t.nodes++
	if t.nodes > t.maxNodes {
		return errLimit{fmt.Sprintf("it has more than %d files", t.maxNodes)}
	}
	if n.inode != nil {
		n.inode.nlink++
		if n.inode.nlink == 1 {
			t.bytes += n.inode.size
			if t.bytes > t.maxBytes {
				return errLimit{fmt.Sprintf("its files hold more than %s uncompressed, the node's limit", humanBytes(t.maxBytes))}
			}
		}
	}
	return nil
}

// release uncounts a node that leaves the tree, with everything under it.
func (t *tree) release(n *node) {
	t.nodes--
	if n.inode != nil {
		n.inode.nlink--
		if n.inode.nlink == 0 {
			t.bytes -= n.inode.size
		}
	}
	for _, c := range n.children {
		t.release(c)
	}
}

// walk finds the directory that holds p's last element, following
// symbolic links on the way as Linux would, inside the tree: a link's
// ".." stops at the root, an absolute target starts from it, so nothing
// resolves outside the image. create makes missing directories (a layer
// need not list its parents); without it a missing one is an error.
func (t *tree) walk(p string, create bool) (dir *node, base string, err error) {
	comps := strings.Split(p, "/")
	var parents []*node
	cur := t.root
	hops := 0
	for i := 0; i < len(comps)-1; i++ {
		c := comps[i]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(parents) > 0 {
				cur, parents = parents[len(parents)-1], parents[:len(parents)-1]
			}
			continue
		}
		child := cur.children[c]
		switch {
		case child == nil:
			if !create {
				return nil, "", fmt.Errorf("%q: no such directory", p)
			}
			child = &node{kind: kindDir, meta: meta{mode: 0o755}, children: map[string]*node{}}
			if err := t.hold(child); err != nil {
				return nil, "", err
			}
			cur.children[c] = child
		case child.kind == kindSymlink:
			hops++
			if hops > maxSymlinkHops {
				return nil, "", fmt.Errorf("%q: too many levels of symbolic links", p)
			}
			if strings.HasPrefix(child.link, "/") {
				cur, parents = t.root, nil
			}
			rest := comps[i+1:]
			comps = append(strings.Split(child.link, "/"), rest...)
			i = -1
			continue
		case child.kind != kindDir:
			return nil, "", fmt.Errorf("%q: %q is not a directory", p, c)
		}
		parents = append(parents, cur)
		cur = child
		if len(parents) >= maxDepth {
			return nil, "", fmt.Errorf("%q: directories nested deeper than %d", p, maxDepth)
		}
	}
	return cur, comps[len(comps)-1], nil
}

// lookup finds the node at p, following symbolic links in its directories
// but not a final one, as link(2) does.
func (t *tree) lookup(p string) (*node, error) {
	if p == "" {
		return t.root, nil
	}
	dir, base, err := t.walk(p, false)
	if err != nil {
		return nil, err
	}
	n := dir.children[base]
	if n == nil {
		return nil, fmt.Errorf("%q: no such file", p)
	}
	return n, nil
}

// visit calls fn for every node under n, parents before children and
// names in byte order, so that what is written from the tree comes out the
// same for the same image.
func (t *tree) visit(fn func(p string, n *node) error) error {
	if err := fn("", t.root); err != nil {
		return err
	}
	return visitChildren("", t.root, fn)
}

func visitChildren(p string, n *node, fn func(string, *node) error) error {
	names := make([]string, 0, len(n.children))
	for name := range n.children {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		c := n.children[name]
		cp := path.Join(p, name)
		if err := fn(cp, c); err != nil {
			return err
		}
		if c.kind == kindDir {
			if err := visitChildren(cp, c, fn); err != nil {
				return err
			}
		}
	}
	return nil
}
