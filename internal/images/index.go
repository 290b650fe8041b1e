package images

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/zyvor/kairon/internal/imagefs"
)

// The cache directory holds one file per image, named by its manifest
// digest, and index.json. Anything named tmpPrefix… is a download or a
// conversion under way, removed by NewStore when a crash left it behind.
const (
	indexFile   = "index.json"
	lockFile    = "lock"
	tmpPrefix   = ".tmp-"
	imageSuffix = ".squashfs"
	// maxIndexBytes bounds index.json; at a few hundred bytes an image it
	// holds far more images than any disk budget.
	maxIndexBytes = 64 << 20
	// maxReferences is how many references an image remembers having
	// been pulled by, for logs and for people reading the index.
	maxReferences = 16
	indexVersion  = 1
)

// record is one cached image in the index.
type record struct {
	// ManifestDigest is the linux/amd64 image manifest's digest: the file
	// holds that image.
	ManifestDigest string `json:"manifestDigest"`
	// Digests are every digest a reference resolved to for it: its
	// manifest's, and an index's that points at it.
	Digests []string `json:"digests"`
	// References it was ensured by, the latest last.
	References []string `json:"references"`
	File       string   `json:"file"`
	SizeBytes  int64    `json:"sizeBytes"`
	// Public is true when it was pulled, or its manifest fetched, without
	// credentials: anyone may use it from the cache. A private image is
	// served by digest only to a caller whose credentials the registry
	// accepts (Ensure asks it).
	Public   bool           `json:"public"`
	Created  time.Time      `json:"created"`
	LastUsed time.Time      `json:"lastUsed"`
	Config   imagefs.Config `json:"config"`
}

type indexDoc struct {
	Version int       `json:"version"`
	Images  []*record `json:"images"`
}

// imageFileName is the file of the image whose manifest has digest d.
func imageFileName(d string) string { return strings.ReplaceAll(d, ":", "-") + imageSuffix }

// loadIndex reads index.json; a missing one is an empty cache. A damaged
// one is reported so that NewStore starts empty rather than trusting it.
func loadIndex(dir string) ([]*record, error) {
	f, err := os.Open(filepath.Join(dir, indexFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxIndexBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxIndexBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", indexFile, maxIndexBytes)
	}
	var doc indexDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", indexFile, err)
	}
	if doc.Version != indexVersion {
		return nil, fmt.Errorf("%s: version %d, this store reads %d", indexFile, doc.Version, indexVersion)
	}
	return doc.Images, nil
}

// saveIndex replaces index.json in one rename, so that a crash leaves the
// old index or the new one, never half of one.
func saveIndex(dir string, recs []*record) error {
	slices.SortFunc(recs, func(a, b *record) int { return strings.Compare(a.ManifestDigest, b.ManifestDigest) })
	b, err := json.MarshalIndent(indexDoc{Version: indexVersion, Images: recs}, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(dir, indexFile, b)
}

// writeFileAtomic writes name in dir through a temporary file, synced,
// then renamed over name, the directory synced after.
func writeFileAtomic(dir, name string, b []byte) error {
	f, err := os.CreateTemp(dir, tmpPrefix+name+"-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// addUnique appends v to list unless it is there, keeping at most max
// entries, the newest; an entry already there moves to the end.
func addUnique(list []string, v string, max int) []string {
	list = slices.DeleteFunc(list, func(s string) bool { return s == v })
	list = append(list, v)
	if len(list) > max {
		list = list[len(list)-max:]
	}
	return list
}
