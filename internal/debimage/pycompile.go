package debimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// CompilePython byte-compiles the Python modules under dirs ("usr/lib/python3.11",
// "usr/lib/python3/dist-packages") with the image's own interpreter
// (python, e.g. "usr/bin/python3.11"), as the postinsts of Debian's Python
// packages do (py_compile, py3compile), and adds the __pycache__ files to
// t. Without them every start of Python compiles what it imports again,
// since a non-root user cannot write the cache: `pip --version` takes
// twice as long.
//
// The interpreter runs from a copy of the tree under work (which must
// outlive t's use: the new files are read from there), through the
// image's own dynamic loader, so no chroot (and no root) is needed. The
// result is reproducible: the sources carry date (which is what the .pyc
// headers record and Python checks), hash randomization is off, and one
// process compiles the files in sorted order. It returns how many files
// it compiled.
func CompilePython(t Tree, work string, date time.Time, python string, dirs ...string) (int, error) {
	root := filepath.Join(work, "pyroot")
	if err := materialize(t, root, date); err != nil {
		return 0, fmt.Errorf("copying the tree to run Python: %w", err)
	}
	loader := filepath.Join(root, "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
	libs := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	args := []string{"--library-path", libs, filepath.Join(root, CleanPath(python)),
		// -B: the modules compileall itself imports are compiled by it,
		// with the image's paths, not cached by the import with the
		// build's.
		"-S", "-B", "-m", "compileall", "-f", "-q", "-j", "1", "--invalidation-mode", "timestamp",
		"-s", root, "-p", "/"}
	for _, d := range dirs {
		args = append(args, filepath.Join(root, CleanPath(d)))
	}
	cmd := exec.Command(loader, args...)
	cmd.Env = []string{"PYTHONHOME=" + filepath.Join(root, "usr"), "PYTHONHASHSEED=0", "LC_ALL=C.UTF-8", "PATH=/usr/bin:/bin"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("python -m compileall: %w: %s", err, tail(out.String(), 2000))
	}
	n := 0
	for _, d := range dirs {
		err := filepath.WalkDir(filepath.Join(root, CleanPath(d)), func(p string, de fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			rel = filepath.ToSlash(rel)
			switch {
			case de.IsDir() && de.Name() == "__pycache__":
				t.Dir(rel, 0o755, 0, 0)
			case de.Type().IsRegular() && strings.HasSuffix(rel, ".pyc") && path.Base(path.Dir(rel)) == "__pycache__":
				t.FileFrom(rel, p, 0o644)
				n++
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("python -m compileall compiled nothing under %v: %s", dirs, tail(out.String(), 2000))
	}
	return n, nil
}

// materialize writes t as real files under root: regular files as hard
// links to their staged content where they have one, symlinks made
// relative to root, every file dated date.
func materialize(t Tree, root string, date time.Time) error {
	names := make([]string, 0, len(t))
	for p := range t {
		names = append(names, p)
	}
	// Parents first.
	sort.Strings(names)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	for _, p := range names {
		if p == "" {
			continue
		}
		e := t[p]
		dst := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		switch e.Type {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return err
			}
		case tar.TypeSymlink:
			target := e.Link
			if path.IsAbs(target) {
				rel, err := filepath.Rel(filepath.Dir(dst), filepath.Join(root, target))
				if err != nil {
					return err
				}
				target = rel
			}
			if err := os.Symlink(target, dst); err != nil {
				return err
			}
		case tar.TypeReg:
			var err error
			if e.Src != "" {
				// A copy where a hard link cannot be made (another file
				// system).
				if err = os.Link(e.Src, dst); err != nil {
					var b []byte
					if b, err = os.ReadFile(e.Src); err == nil {
						err = os.WriteFile(dst, b, 0o644)
					}
				}
			} else {
				err = os.WriteFile(dst, e.Data, 0o644)
			}
			if err != nil {
				return err
			}
			if err := os.Chmod(dst, os.FileMode(e.Mode&0o777)|0o200); err != nil {
				return err
			}
			if err := os.Chtimes(dst, date, date); err != nil {
				return err
			}
		}
	}
	return nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
