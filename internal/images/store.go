package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"golang.org/x/sys/unix"

	"github.com/zyvor/kairon/internal/imagefs"
)

// Defaults of Options' limits.
const (
	DefaultMaxCompressedBytes   = 2 << 30
	DefaultMaxUncompressedBytes = 8 << 30
	DefaultDiskBudgetBytes      = 20 << 30
	// DefaultMaxFiles bounds the files, directories and links of one
	// image: the store holds them all in memory while flattening (a few
	// hundred bytes each). Debian's python3 image has about 10,000.
	DefaultMaxFiles = 1 << 20
)

// Options configure a Store.
type Options struct {
	// Dir is the cache directory (created 0700): one file per image,
	// index.json, and a lock file that keeps a second store out.
	Dir string
	// MaxCompressedBytes refuses an image whose layers sum above it, from
	// its manifest, before downloading (0: 2 GiB).
	MaxCompressedBytes int64
	// MaxUncompressedBytes refuses an image whose flattened tree's files
	// hold more (0: 8 GiB). Its layers may decompress to at most twice as
	// much, shadowed content included.
	MaxUncompressedBytes int64
	// MaxFiles refuses an image with more files (0: DefaultMaxFiles).
	MaxFiles int64
	// DiskBudgetBytes is what GC brings the cache under (0: 20 GiB).
	DiskBudgetBytes int64
	// Insecure lists registries (host:port) spoken to over plain HTTP;
	// loopback always may be, no other host ever is.
	Insecure []string
	// Metrics receives the store's measurements (nil: none).
	Metrics Metrics
	Log     logr.Logger
}

// Image is a cached image: its filesystem image, ready to boot.
type Image struct {
	// Digest is what the reference resolved to, as Resolve returns it: an
	// image index's digest, or the image manifest's.
	Digest string
	// ManifestDigest is the linux/amd64 image manifest's digest.
	ManifestDigest string
	// Reference is the reference it was ensured by (for Lookup, the last
	// one).
	Reference string
	// Path is the squashfs file (internal/imagefs), read-only. It stays
	// until GC removes it, which it never does while inUse says it is
	// needed.
	Path string
	// Config is what config.json in it holds.
	Config imagefs.Config
	// SizeBytes is the file's size.
	SizeBytes int64
}

// Store pulls, converts and caches the images a node's Machines boot.
type Store struct {
	opts     Options
	log      logr.Logger
	metrics  Metrics
	resolver *Resolver
	lock     *os.File

	mu      sync.Mutex
	images  map[string]*record // by manifest digest
	aliases map[string]string  // every digest an image is known by → its manifest digest

	refFlights    flights[ensured]
	digestFlights flights[*record]
}

// NewStore opens the cache in o.Dir, creating it if needed. It removes
// what a crash left behind: temporary files, image files the index does
// not list, and index entries whose file is gone.
func NewStore(o Options) (*Store, error) {
	if o.Dir == "" {
		return nil, errors.New("images: Options.Dir is empty")
	}
	if o.MaxCompressedBytes <= 0 {
		o.MaxCompressedBytes = DefaultMaxCompressedBytes
	}
	if o.MaxUncompressedBytes <= 0 {
		o.MaxUncompressedBytes = DefaultMaxUncompressedBytes
	}
	if o.MaxFiles <= 0 {
		o.MaxFiles = DefaultMaxFiles
	}
	if o.DiskBudgetBytes <= 0 {
		o.DiskBudgetBytes = DefaultDiskBudgetBytes
	}
	if o.Metrics == nil {
		o.Metrics = noMetrics{}
	}
	if _, err := exec.LookPath(Sqfstar); err != nil {
		return nil, fmt.Errorf("images: %s not found (Debian package squashfs-tools): %w", Sqfstar, err)
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("images: cache directory: %w", err)
	}
	if err := os.Chmod(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("images: cache directory: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(o.Dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("images: cache directory: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("images: cache directory %s is in use by another store: %w", o.Dir, err)
	}
	s := &Store{
		opts:     o,
		log:      o.Log,
		metrics:  o.Metrics,
		resolver: NewResolver(o.Insecure, "kairon-node"),
		lock:     lock,
		images:   map[string]*record{},
		aliases:  map[string]string{},
	}
	if err := s.recover(); err != nil {
		lock.Close()
		return nil, err
	}
	return s, nil
}

// Close stops the pulls under way (their callers get an error), waits for
// them to clean up, and releases the cache directory for another store.
func (s *Store) Close() error {
	s.refFlights.stop()
	s.digestFlights.stop()
	return s.lock.Close()
}

// recover makes the directory and the index agree after a crash.
func (s *Store) recover() error {
	recs, err := loadIndex(s.opts.Dir)
	changed := false
	if err != nil {
		s.log.Error(err, "image cache index unreadable; starting with an empty cache", "dir", s.opts.Dir)
		recs, changed = nil, true
	}
	entries, err := os.ReadDir(s.opts.Dir)
	if err != nil {
		return fmt.Errorf("images: cache directory: %w", err)
	}
	files := map[string]int64{}
	for _, e := range entries {
		switch {
		case strings.HasPrefix(e.Name(), tmpPrefix):
			s.log.Info("removing a leftover temporary file", "file", e.Name())
			if err := os.RemoveAll(filepath.Join(s.opts.Dir, e.Name())); err != nil {
				return fmt.Errorf("images: removing leftover %s: %w", e.Name(), err)
			}
		case strings.HasSuffix(e.Name(), imageSuffix) && e.Type().IsRegular():
			if fi, err := e.Info(); err == nil {
				files[e.Name()] = fi.Size()
			}
		}
	}
	for _, r := range recs {
		size, ok := files[r.File]
		if !ok || r.File != imageFileName(r.ManifestDigest) || size != r.SizeBytes || s.images[r.ManifestDigest] != nil {
			s.log.Info("dropping a cached image whose file is missing or damaged", "digest", r.ManifestDigest)
			changed = true
			continue
		}
		s.addRecord(r)
	}
	for f := range files {
		if !s.listed(f) {
			// A crash between renaming the file into place and writing the
			// index: it was complete, but what it is is not recorded.
			s.log.Info("removing an image file the index does not list", "file", f)
			if err := os.Remove(filepath.Join(s.opts.Dir, f)); err != nil {
				return fmt.Errorf("images: removing %s: %w", f, err)
			}
		}
	}
	if changed {
		if err := s.saveLocked(); err != nil {
			return fmt.Errorf("images: writing the index: %w", err)
		}
	}
	s.reportUsageLocked()
	return nil
}

func (s *Store) listed(file string) bool {
	for _, r := range s.images {
		if r.File == file {
			return true
		}
	}
	return false
}

func (s *Store) addRecord(r *record) {
	s.images[r.ManifestDigest] = r
	s.aliases[r.ManifestDigest] = r.ManifestDigest
	for _, d := range r.Digests {
		s.aliases[d] = r.ManifestDigest
	}
}

func (s *Store) saveLocked() error {
	recs := make([]*record, 0, len(s.images))
	for _, r := range s.images {
		recs = append(recs, r)
	}
	return saveIndex(s.opts.Dir, recs)
}

func (s *Store) reportUsageLocked() {
	var total int64
	for _, r := range s.images {
		total += r.SizeBytes
	}
	s.metrics.CacheUsage(len(s.images), total)
}

// Resolve returns the digest (sha256:…) ref names now, without pulling: a
// digest reference's own, a tag's from the registry (a HEAD request).
func (s *Store) Resolve(ctx context.Context, ref string, kc authn.Keychain) (string, error) {
	d, err := s.resolver.Resolve(ctx, ref, kc)
	if err != nil {
		s.failed(err)
	}
	return d, err
}

// Ensure returns the image ref names, pulling, verifying and converting it
// unless it is cached; it returns once the file is complete. Concurrent
// calls for one image pull it once. A tag is always resolved with the
// registry; a digest is served from the cache without it, except that a
// private image (pulled with credentials) is first checked to be readable
// with kc's. Errors about the image are *PullError; another error is the
// node's own (a full disk, sqfstar failing) or ctx's.
func (s *Store) Ensure(ctx context.Context, ref string, kc authn.Keychain) (*Image, error) {
	img, err := s.ensure(ctx, ref, kc)
	if err != nil {
		s.failed(err)
		return nil, err
	}
	return img, nil
}

// ensured is one Ensure's result, shared by the callers of one flight;
// pulled says whether it was pulled rather than found in the cache.
type ensured struct {
	img    *Image
	pulled bool
}

func (s *Store) ensure(ctx context.Context, ref string, kc authn.Keychain) (*Image, error) {
	e, err := s.ensureShared(ctx, ref, kc)
	if err != nil {
		return nil, err
	}
	if e.pulled {
		s.metrics.CacheMiss()
	} else {
		s.metrics.CacheHit()
	}
	img := *e.img
	return &img, nil
}

func (s *Store) ensureShared(ctx context.Context, ref string, kc authn.Keychain) (ensured, error) {
	r, err := s.resolver.parseReference(ref)
	if err != nil {
		return ensured{}, err
	}
	if d, ok := r.(name.Digest); ok {
		if img := s.use(d.DigestStr(), ref, "", true); img != nil {
			return ensured{img: img}, nil
		}
	}
	p, err := s.resolver.newPuller(r, kc)
	if err != nil {
		return ensured{}, err
	}
	key := ref + "\x00" + credentialsKey(kc, r.Context())
	return s.refFlights.do(ctx, key, func(ctx context.Context) (ensured, error) {
		if d, ok := r.(name.Digest); ok && s.cached(d.DigestStr()) {
			// A private image: the caller may have it if the registry lets
			// its credentials read the manifest.
			if _, err := p.headDigest(ctx, ref); err != nil {
				return ensured{}, err
			}
			s.markPublic(d.DigestStr(), p.anonymous)
			if img := s.use(d.DigestStr(), ref, "", false); img != nil {
				return ensured{img: img}, nil
			}
		}
		res, err := p.resolve(ctx, ref)
		if err != nil {
			return ensured{}, err
		}
		// The registry gave the caller the manifest: the cached image is
		// the caller's to use, public or not.
		if img := s.use(res.manifestDigest, ref, res.digest, false); img != nil {
			s.markPublic(res.manifestDigest, p.anonymous)
			return ensured{img: img}, nil
		}
		_, err = s.digestFlights.do(ctx, res.manifestDigest, func(ctx context.Context) (*record, error) {
			return s.pull(ctx, ref, p, res)
		})
		if err != nil {
			var pe *PullError
			if errors.As(err, &pe) && pe.Reference != ref {
				// Another reference's pull of the same image failed.
				return ensured{}, &PullError{Reference: ref, Reason: pe.Reason, Err: pe.Err}
			}
			return ensured{}, err
		}
		s.markPublic(res.manifestDigest, p.anonymous)
		img := s.use(res.manifestDigest, ref, res.digest, false)
		if img == nil {
			return ensured{}, fmt.Errorf("images: %s was removed from the cache as soon as it was pulled", ref)
		}
		return ensured{img: img, pulled: true}, nil
	})
}

// Lookup returns a cached image by any digest it is known by, without the
// network and without checking credentials: for the node's own needs (a
// VM it restores or receives), not for a new Machine's request.
func (s *Store) Lookup(digest string) (*Image, bool) {
	img := s.use(digest, "", "", false)
	return img, img != nil
}

// use returns the cached image known by digest, marking it used now, and
// records ref and alias (another digest it is known by) when given. With
// publicOnly, a private image is not returned.
func (s *Store) use(digest, ref, alias string, publicOnly bool) *Image {
	s.mu.Lock()
	defer s.mu.Unlock()
	md, ok := s.aliases[digest]
	if !ok {
		return nil
	}
	r := s.images[md]
	if publicOnly && !r.Public {
		return nil
	}
	path := filepath.Join(s.opts.Dir, r.File)
	if _, err := os.Stat(path); err != nil {
		// Someone removed it behind the store's back: forget it, so that
		// Ensure pulls it again.
		s.log.Error(err, "cached image file is gone", "digest", md)
		s.removeLocked(r)
		return nil
	}
	r.LastUsed = time.Now()
	if ref != "" {
		r.References = addUnique(r.References, ref, maxReferences)
	}
	if alias != "" && alias != md {
		r.Digests = addUnique(r.Digests, alias, maxReferences)
		s.aliases[alias] = md
	}
	if err := s.saveLocked(); err != nil {
		s.log.Error(err, "writing the image cache index")
	}
	img := &Image{Digest: digest, ManifestDigest: md, Reference: ref, Path: path, Config: cloneConfig(r.Config), SizeBytes: r.SizeBytes}
	if alias != "" {
		img.Digest = alias
	}
	if ref == "" && len(r.References) > 0 {
		img.Reference = r.References[len(r.References)-1]
	}
	return img
}

// cloneConfig copies c's slices, so that a caller changing its Image does
// not change the cache's record.
func cloneConfig(c imagefs.Config) imagefs.Config {
	c.Env = slices.Clone(c.Env)
	c.Entrypoint = slices.Clone(c.Entrypoint)
	c.Cmd = slices.Clone(c.Cmd)
	return c
}

// cached reports whether an image known by digest is in the cache.
func (s *Store) cached(digest string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.aliases[digest]
	return ok
}

// markPublic records that the image known by digest was read from its
// registry without credentials.
func (s *Store) markPublic(digest string, anonymous bool) {
	if !anonymous {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.images[s.aliases[digest]]; r != nil && !r.Public {
		r.Public = true
		if err := s.saveLocked(); err != nil {
			s.log.Error(err, "writing the image cache index")
		}
	}
}

func (s *Store) failed(err error) {
	var pe *PullError
	if errors.As(err, &pe) {
		s.metrics.PullFailed(pe.Reason)
	}
}

// credentialsKey tells apart the credentials kc has for repo, without
// keeping them: Ensure calls with other credentials do not share a flight,
// so that one caller's credentials never fetch a manifest for another.
func credentialsKey(kc authn.Keychain, repo name.Repository) string {
	if kc == nil {
		return "anonymous"
	}
	a, err := kc.Resolve(repo)
	if err != nil || a == authn.Anonymous {
		return "anonymous"
	}
	cfg, err := a.Authorization()
	if err != nil {
		return "unresolvable"
	}
	b, _ := json.Marshal(cfg)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
