package images

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
)

// GC removes cached images, least recently used first, until the cache is
// under Options.DiskBudgetBytes, never one that inUse reports needed.
// inUse is asked with every digest an image is known by (its manifest's,
// an index's), and must count what the caller is about to use: a Machine
// starting, a saved state, a snapshot. It returns the manifest digests of
// the images it removed.
func (s *Store) GC(inUse func(digest string) bool) (removed []string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var total int64
	recs := make([]*record, 0, len(s.images))
	for _, r := range s.images {
		total += r.SizeBytes
		recs = append(recs, r)
	}
	if total <= s.opts.DiskBudgetBytes {
		return nil, nil
	}
	slices.SortFunc(recs, func(a, b *record) int { return a.LastUsed.Compare(b.LastUsed) })
	var errs []error
	for _, r := range recs {
		if total <= s.opts.DiskBudgetBytes {
			break
		}
		if slices.ContainsFunc(append([]string{r.ManifestDigest}, r.Digests...), inUse) {
			continue
		}
		if err := os.Remove(filepath.Join(s.opts.Dir, r.File)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		s.log.Info("removed an unused image from the cache", "digest", r.ManifestDigest, "bytes", r.SizeBytes, "lastUsed", r.LastUsed)
		s.forgetLocked(r)
		total -= r.SizeBytes
		removed = append(removed, r.ManifestDigest)
	}
	if len(removed) > 0 {
		if err := s.saveLocked(); err != nil {
			errs = append(errs, err)
		}
		s.reportUsageLocked()
	}
	return removed, errors.Join(errs...)
}

// removeLocked drops an image whose file is gone from the index.
func (s *Store) removeLocked(r *record) {
	s.forgetLocked(r)
	if err := s.saveLocked(); err != nil {
		s.log.Error(err, "writing the image cache index")
	}
	s.reportUsageLocked()
}

func (s *Store) forgetLocked(r *record) {
	delete(s.images, r.ManifestDigest)
	for d, md := range s.aliases {
		if md == r.ManifestDigest {
			delete(s.aliases, d)
		}
	}
}
