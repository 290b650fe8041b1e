package crd_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/zyvor/kairon/internal/testenv"
)

// TestGeneratedFilesAreCurrent regenerates deepcopy code and CRDs from a copy
// of api/ and fails when the committed files differ, so a type change without
// `make generate` never lands.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	controllerGen := filepath.Join(testenv.BinDir(t), "controller-gen")

	work := t.TempDir()
	for _, name := range []string{"go.mod", "go.sum"} {
		copyFile(t, filepath.Join(root, name), filepath.Join(work, name))
	}
	if err := os.CopyFS(filepath.Join(work, "api"), os.DirFS(filepath.Join(root, "api"))); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"object", "paths=./api/..."},
		{"crd", "paths=./api/...", "output:crd:artifacts:config=config/crd/bases"},
	} {
		cmd := exec.Command(controllerGen, args...)
		cmd.Dir = work
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("controller-gen %v: %v\n%s", args, err, out)
		}
	}

	compareTrees(t, filepath.Join(root, "api"), filepath.Join(work, "api"), "zz_generated.deepcopy.go")
	compareTrees(t, filepath.Join(root, "config/crd/bases"), filepath.Join(work, "config/crd/bases"), "*.yaml")
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// compareTrees checks that files matching pattern are identical, and that
// neither tree has one the other lacks.
func compareTrees(t *testing.T, committed, generated, pattern string) {
	t.Helper()
	list := func(dir string) map[string][]byte {
		files := map[string][]byte{}
		_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			if ok, _ := filepath.Match(pattern, d.Name()); ok {
				rel, _ := filepath.Rel(dir, path)
				files[rel], err = os.ReadFile(path)
			}
			return err
		})
		return files
	}
	want, have := list(generated), list(committed)
	if len(want) == 0 {
		t.Fatalf("controller-gen wrote no %s under %s", pattern, generated)
	}
	for name, data := range want {
		if old, ok := have[name]; !ok {
			t.Errorf("%s is missing: run `make generate`", filepath.Join(committed, name))
		} else if !bytes.Equal(old, data) {
			t.Errorf("%s is stale: run `make generate`", filepath.Join(committed, name))
		}
	}
	for name := range have {
		if _, ok := want[name]; !ok {
			t.Errorf("%s is no longer generated: delete it or run `make generate`", filepath.Join(committed, name))
		}
	}
}
