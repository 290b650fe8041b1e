package images

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestNewStoreRecovers opens a cache directory as a crash could have left
// it: temporary files of a pull and a conversion, an image file the index
// does not list (renamed into place, index not yet written), and an index
// entry whose file is gone. NewStore keeps only the complete, listed image.
func TestNewStoreRecovers(t *testing.T) {
	dir := t.TempDir()
	good := "sha256:" + strings.Repeat("a", 64)
	gone := "sha256:" + strings.Repeat("b", 64)
	orphan := "sha256:" + strings.Repeat("c", 64)
	write := func(name string, size int) {
		if err := os.WriteFile(filepath.Join(dir, name), make([]byte, size), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	write(imageFileName(good), 4096)
	write(imageFileName(orphan), 4096)
	write(tmpPrefix+"layer-123", 100)
	write(tmpPrefix+imageFileName(orphan)+"-1", 100)
	if err := os.Mkdir(filepath.Join(dir, tmpPrefix+"dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	write("unrelated", 1)
	now := time.Now()
	if err := saveIndex(dir, []*record{
		{ManifestDigest: good, File: imageFileName(good), SizeBytes: 4096, Created: now, LastUsed: now},
		{ManifestDigest: gone, File: imageFileName(gone), SizeBytes: 4096, Created: now, LastUsed: now},
	}); err != nil {
		t.Fatal(err)
	}

	s := newStore(t, Options{Dir: dir})
	got := cacheFiles(t, dir)
	want := []string{imageFileName(good), indexFile, "unrelated"}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("the directory holds %v, want %v", got, want)
	}
	if _, ok := s.Lookup(good); !ok {
		t.Error("the complete image is not cached")
	}
	for _, d := range []string{gone, orphan} {
		if _, ok := s.Lookup(d); ok {
			t.Errorf("%s is cached", d)
		}
	}
	recs, err := loadIndex(dir)
	if err != nil || len(recs) != 1 || recs[0].ManifestDigest != good {
		t.Fatalf("index after recovery: %+v, %v; want only %s", recs, err, good)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("cache directory: %v, %v; want mode 0700", fi, err)
	}

	// One store per directory.
	if _, err := NewStore(Options{Dir: dir}); err == nil || !strings.Contains(err.Error(), "in use by another store") {
		t.Fatalf("a second store on %s: %v, want refused", dir, err)
	}
}

// TestNewStoreDamagedIndex starts empty from an index it cannot read, and
// removes the files it no longer knows.
func TestNewStoreDamagedIndex(t *testing.T) {
	dir := t.TempDir()
	d := "sha256:" + strings.Repeat("a", 64)
	if err := os.WriteFile(filepath.Join(dir, imageFileName(d)), make([]byte, 4096), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, indexFile), []byte(`{"version":1,"images":[{`), 0o600); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, Options{Dir: dir})
	if _, ok := s.Lookup(d); ok {
		t.Fatal("an image of a damaged index is cached")
	}
	if files := cacheFiles(t, dir); len(files) != 1 || files[0] != indexFile {
		t.Fatalf("the directory holds %v, want the index alone", files)
	}
	if recs, err := loadIndex(dir); err != nil || len(recs) != 0 {
		t.Fatalf("the index was not rewritten empty: %v, %v", recs, err)
	}
}
