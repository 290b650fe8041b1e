package images

import (
	"fmt"
	"strings"
	"testing"
)

// dump lists a tree as "path kind detail" lines, in path order; a regular
// file's detail is where its content is (layer:index) and its size, so
// hard links show as two paths with the same content.
func dump(t *tree) string {
	var lines []string
	_ = t.visit(func(p string, n *node) error {
		if p == "" {
			p = "/"
		}
		switch n.kind {
		case kindDir:
			lines = append(lines, fmt.Sprintf("%s dir %o %d:%d", p, n.meta.mode, n.meta.uid, n.meta.gid))
		case kindReg:
			lines = append(lines, fmt.Sprintf("%s reg %d:%d %d", p, n.inode.layer, n.inode.index, n.inode.size))
		case kindSymlink:
			lines = append(lines, fmt.Sprintf("%s sym %s", p, n.link))
		case kindFifo:
			lines = append(lines, fmt.Sprintf("%s fifo", p))
		}
		return nil
	})
	return strings.Join(lines, "\n")
}

func dir(p string) entry { return entry{kind: kindDir, path: p, meta: meta{mode: 0o755}} }
func reg(p string, size int64) entry {
	return entry{kind: kindReg, path: p, size: size, meta: meta{mode: 0o644}}
}
func sym(p, target string) entry  { return entry{kind: kindSymlink, path: p, link: target} }
func hard(p, target string) entry { return entry{kind: kindHardlink, path: p, link: target} }
func wh(p string) entry           { return entry{kind: kindWhiteout, path: p} }
func opq(p string) entry          { return entry{kind: kindOpaque, path: p} }

func TestTree(t *testing.T) {
	for _, tc := range []struct {
		name    string
		layers  [][]entry
		want    string
		wantErr string
	}{
		{name: "parents made implicitly",
			layers: [][]entry{{reg("a/b/c", 3)}},
			want:   "/ dir 755 0:0\na dir 755 0:0\na/b dir 755 0:0\na/b/c reg 0:0 3"},
		{name: "a later file replaces an earlier one",
			layers: [][]entry{{reg("f", 1)}, {reg("f", 2)}},
			want:   "/ dir 755 0:0\nf reg 1:0 2"},
		{name: "a directory over a directory takes its metadata and keeps its content",
			layers: [][]entry{{dir("d"), reg("d/x", 1)}, {{kind: kindDir, path: "d", meta: meta{mode: 0o700, uid: 5, gid: 6}}}},
			want:   "/ dir 755 0:0\nd dir 700 5:6\nd/x reg 0:1 1"},
		{name: "a file over a directory removes what it held",
			layers: [][]entry{{dir("d"), reg("d/x", 1)}, {reg("d", 4)}},
			want:   "/ dir 755 0:0\nd reg 1:0 4"},
		{name: "whiteout removes a file and a directory tree",
			layers: [][]entry{{reg("a", 1), dir("d"), reg("d/x", 1), reg("keep", 1)}, {wh("a"), wh("d")}},
			want:   "/ dir 755 0:0\nkeep reg 0:3 1"},
		{name: "whiteout applies to the layers below only, wherever it is listed",
			layers: [][]entry{{reg("a", 1)}, {reg("a", 2), wh("a")}},
			want:   "/ dir 755 0:0\na reg 1:0 2"},
		{name: "whiteout of something absent",
			layers: [][]entry{{reg("a", 1)}, {wh("nope"), wh("no/such/dir")}},
			want:   "/ dir 755 0:0\na reg 0:0 1"},
		{name: "opaque directory hides what is below, keeps its own layer's entries",
			layers: [][]entry{{dir("d"), reg("d/old", 1), dir("d/sub"), reg("d/sub/deep", 1)}, {reg("d/new", 1), dir("d/sub"), opq("d")}},
			want:   "/ dir 755 0:0\nd dir 755 0:0\nd/new reg 1:0 1\nd/sub dir 755 0:0"},
		{name: "hard links share content",
			layers: [][]entry{{reg("bin/a", 9), hard("bin/b", "bin/a")}, {hard("c", "bin/b")}},
			want:   "/ dir 755 0:0\nbin dir 755 0:0\nbin/a reg 0:0 9\nbin/b reg 0:0 9\nc reg 0:0 9"},
		{name: "a replaced hard link target keeps the old content for the other name",
			layers: [][]entry{{reg("a", 1), hard("b", "a")}, {reg("a", 2)}},
			want:   "/ dir 755 0:0\na reg 1:0 2\nb reg 0:0 1"},
		{name: "a whited out hard link target keeps the other name",
			layers: [][]entry{{reg("a", 1), hard("b", "a")}, {wh("a")}},
			want:   "/ dir 755 0:0\nb reg 0:0 1"},
		{name: "hard link to a symlink copies it",
			layers: [][]entry{{sym("s", "/x"), hard("t", "s")}},
			want:   "/ dir 755 0:0\ns sym /x\nt sym /x"},
		{name: "hard link to itself",
			layers: [][]entry{{reg("a", 1), hard("a", "a")}},
			want:   "/ dir 755 0:0\na reg 0:0 1"},
		{name: "hard link to nothing", layers: [][]entry{{hard("b", "a")}}, wantErr: `hard link "b": its target "a" is not a file earlier in the image`},
		{name: "hard link to a directory", layers: [][]entry{{dir("d"), hard("b", "d")}}, wantErr: "is not a file earlier"},
		{name: "entries under a symlinked directory land in its target",
			layers: [][]entry{{dir("usr/bin"), sym("bin", "usr/bin")}, {reg("bin/tool", 1)}},
			want:   "/ dir 755 0:0\nbin sym usr/bin\nusr dir 755 0:0\nusr/bin dir 755 0:0\nusr/bin/tool reg 1:0 1"},
		{name: "a symlink climbing out stops at the root",
			layers: [][]entry{{dir("a"), sym("a/up", "../../../../etc")}, {reg("a/up/passwd", 1)}},
			want:   "/ dir 755 0:0\na dir 755 0:0\na/up sym ../../../../etc\netc dir 755 0:0\netc/passwd reg 1:0 1"},
		{name: "an absolute symlink resolves from the image's root",
			layers: [][]entry{{dir("x/y"), sym("x/y/l", "/opt")}, {reg("x/y/l/f", 1)}},
			want:   "/ dir 755 0:0\nopt dir 755 0:0\nopt/f reg 1:0 1\nx dir 755 0:0\nx/y dir 755 0:0\nx/y/l sym /opt"},
		{name: "whiteout through a symlinked directory",
			layers: [][]entry{{dir("usr/bin"), reg("usr/bin/tool", 1), sym("bin", "usr/bin")}, {wh("bin/tool")}},
			want:   "/ dir 755 0:0\nbin sym usr/bin\nusr dir 755 0:0\nusr/bin dir 755 0:0"},
		{name: "symlink loop", layers: [][]entry{{sym("a", "b"), sym("b", "a"), reg("a/x", 1)}}, wantErr: "too many levels of symbolic links"},
		{name: "a file as a parent", layers: [][]entry{{reg("f", 1), reg("f/x", 1)}}, wantErr: `"f/x": "f" is not a directory`},
		{name: "a symlink replacing a directory",
			layers: [][]entry{{dir("d"), reg("d/x", 1)}, {sym("d", "/elsewhere")}},
			want:   "/ dir 755 0:0\nd sym /elsewhere"},
		{name: "root metadata", layers: [][]entry{{{kind: kindDir, path: "", meta: meta{mode: 0o700, uid: 1}}}}, want: "/ dir 700 1:0"},
		{name: "fifo", layers: [][]entry{{{kind: kindFifo, path: "p"}}}, want: "/ dir 755 0:0\np fifo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTree(1<<30, 1000)
			var err error
			for i, l := range tc.layers {
				index := make([]int, len(l))
				for j := range index {
					index[j] = j
				}
				if err = tr.applyLayer(i, l, index); err != nil {
					break
				}
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q; tree:\n%s", err, tc.wantErr, dump(tr))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := dump(tr); got != tc.want {
				t.Fatalf("tree:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

// TestTreeLimits checks that the tree counts each inode's bytes once,
// uncounts what leaves it, and refuses growing past its node limit.
func TestTreeLimits(t *testing.T) {
	tr := newTree(100, 5)
	if err := tr.applyLayer(0, []entry{reg("a", 60), hard("b", "a")}, []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	if tr.bytes != 60 || tr.nodes != 2 {
		t.Fatalf("bytes %d nodes %d, want 60 and 2 (a hard link's content counts once)", tr.bytes, tr.nodes)
	}
	if err := tr.applyLayer(1, []entry{wh("a"), reg("c", 30)}, []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	if tr.bytes != 90 || tr.nodes != 2 {
		t.Fatalf("bytes %d nodes %d, want 90 and 2 (b still holds a's content)", tr.bytes, tr.nodes)
	}
	if err := tr.applyLayer(2, []entry{wh("b"), wh("c")}, []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	if tr.bytes != 0 || tr.nodes != 0 {
		t.Fatalf("bytes %d nodes %d after removing everything, want 0", tr.bytes, tr.nodes)
	}
	err := tr.applyLayer(3, []entry{reg("a/b/c/d/e/f", 1)}, []int{0})
	var lim errLimit
	if !asLimit(err, &lim) || !strings.Contains(lim.what, "more than 5 files") {
		t.Fatalf("6 nodes in a tree of at most 5: got %v", err)
	}
}

func asLimit(err error, lim *errLimit) bool {
	l, ok := err.(errLimit)
	if ok {
		*lim = l
	}
	return ok
}
