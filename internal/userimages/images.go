package userimages

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/zyvor/kairon/internal/debimage"
)

// Image is an image users start from: how it is named and how it is built.
type Image struct {
	// Repository and Tag name it in a registry ("kairon/python", "3.11").
	Repository, Tag string
	// Description is its org.opencontainers.image.description label.
	Description string
	// lock is its Debian packages (a debimage lock file's content).
	lock []byte
	// recipe is bumped whenever build makes other files from one lock; it
	// is part of the cache key.
	recipe int
	// build makes the image's layers and config from its unpacked
	// packages; work is a scratch directory that outlives the image.
	build func(b *build) (v1.Image, error)
}

// All are the images kairon-local's registry holds.
var All = []Image{Python}

// Name is repository:tag.
func (i Image) Name() string { return i.Repository + ":" + i.Tag }

// KeyLabel is the config label holding the build's key: a registry whose
// image carries the same key holds this very build.
const KeyLabel = "dev.zyvor.kairon.image.key"

// Key identifies one build: the same key, the same bytes.
func (i Image) Key() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%d\x00", i.Repository, i.Tag, i.recipe)
	h.Write(i.lock)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Lock is the image's lock: its Debian packages and date.
func (i Image) Lock() (debimage.Lock, error) {
	return debimage.ParseLock(i.Repository+" lock", i.lock)
}

// Options tune Build and Ensure.
type Options struct {
	// CacheDir holds built images and downloaded packages; empty:
	// DefaultCacheDir().
	CacheDir string
	// Progress receives a line when a slow step starts (a build, a
	// download, a push); nil discards them.
	Progress io.Writer
}

// DefaultCacheDir is $KAIRON_IMAGES_CACHE, else ~/.cache/kairon/images
// ($XDG_CACHE_HOME/kairon/images), beside the tools' cache.
func DefaultCacheDir() (string, error) {
	if d := os.Getenv("KAIRON_IMAGES_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for the images (set KAIRON_IMAGES_CACHE): %w", err)
	}
	return filepath.Join(d, "kairon", "images"), nil
}

func (o Options) cacheDir() (string, error) {
	if o.CacheDir != "" {
		return filepath.Abs(o.CacheDir)
	}
	return DefaultCacheDir()
}

func (o Options) progress(format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, format+"\n", args...)
	}
}

// cachePrefix is the start of the name of i's cached layouts.
func (i Image) cachePrefix() string {
	return strings.ReplaceAll(i.Repository, "/", "-") + "-" + i.Tag + "-"
}

// Build returns the image, built into the cache the first time and read
// from there after. Builds of one cache serialize on a lock file, so
// callers in several processes build it once. built says whether this call
// built it.
func (i Image) Build(ctx context.Context, o Options) (img v1.Image, built bool, err error) {
	cache, err := o.cacheDir()
	if err != nil {
		return nil, false, err
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, false, fmt.Errorf("image cache: %w", err)
	}
	dir := filepath.Join(cache, i.cachePrefix()+i.Key())
	if img, err := readCached(dir); err == nil {
		return img, false, nil
	}
	unlock, err := lockFile(ctx, filepath.Join(cache, ".lock"))
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	// Another process may have built it while this one waited.
	if img, err := readCached(dir); err == nil {
		return img, false, nil
	}
	// Scratch directories left by a build whose process died: only the
	// holder of the lock builds.
	stale, _ := filepath.Glob(filepath.Join(cache, ".build-*"))
	for _, d := range stale {
		_ = os.RemoveAll(d)
	}
	began := time.Now()
	o.progress("building %s from Debian packages (the first time only; cached in %s) ...", i.Name(), cache)
	if err := i.buildInto(ctx, cache, dir, o); err != nil {
		return nil, false, fmt.Errorf("building %s: %w", i.Name(), err)
	}
	img, err = readCached(dir)
	if err != nil {
		return nil, false, err
	}
	d, _ := img.Digest()
	o.progress("built %s (%s) in %s", i.Name(), d, time.Since(began).Round(time.Second))
	i.prune(cache, dir)
	return img, true, nil
}

// readCached reads a finished cached layout: its one image.
func readCached(dir string) (v1.Image, error) {
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err != nil {
		return nil, err
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Manifests) != 1 {
		return nil, fmt.Errorf("%s: %d images, want 1", dir, len(m.Manifests))
	}
	return idx.Image(m.Manifests[0].Digest)
}

// build is one build's state, handed to an image's recipe.
type build struct {
	ctx      context.Context
	image    Image
	lock     debimage.Lock
	debs     map[string]string
	work     string // scratch, removed after the build
	progress func(format string, args ...any)
}

// buildInto builds the image into the layout dir, through a scratch
// directory in cache that is removed whatever happens; dir appears whole
// or not at all.
func (i Image) buildInto(ctx context.Context, cache, dir string, o Options) error {
	lock, err := i.Lock()
	if err != nil {
		return err
	}
	if lock.Date.IsZero() {
		return fmt.Errorf("%s lock: no source-date-epoch", i.Name())
	}
	work, err := os.MkdirTemp(cache, ".build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	var progress io.Writer
	if o.Progress != nil {
		progress = o.Progress
	}
	debs, err := debimage.Fetch(filepath.Join(cache, "debs"), lock.Packages, progress)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	img, err := i.build(&build{ctx: ctx, image: i, lock: lock, debs: debs, work: work, progress: o.progress})
	if err != nil {
		return err
	}
	tmp := filepath.Join(work, "layout")
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": i.Name(),
	})); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

// prune removes the cached builds of i other than keep, and the packages
// no image's lock lists any more: a changed lock or recipe leaves them
// behind.
func (i Image) prune(cache, keep string) {
	old, _ := filepath.Glob(filepath.Join(cache, i.cachePrefix()+"*"))
	for _, d := range old {
		if d != keep {
			_ = os.RemoveAll(d)
		}
	}
	wanted := map[string]bool{}
	for _, img := range All {
		l, err := img.Lock()
		if err != nil {
			return
		}
		for _, p := range l.Packages {
			wanted[p.Name+"_"+strings.ReplaceAll(p.Version, ":", "%3a")+"_"] = true
		}
	}
	debs, _ := filepath.Glob(filepath.Join(cache, "debs", "*.deb"))
	for _, d := range debs {
		base := filepath.Base(d)
		name, rest, _ := strings.Cut(base, "_")
		ver, _, _ := strings.Cut(rest, "_")
		if !wanted[name+"_"+ver+"_"] {
			_ = os.Remove(d)
		}
	}
}

// lockFile takes an exclusive flock on file, waiting until ctx ends.
func lockFile(ctx context.Context, file string) (unlock func(), err error) {
	f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			_ = f.Truncate(0)
			_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", file, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another build to release %s: %w", file, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// CachedLayout is the OCI image layout directory the cache keeps this
// build in (podman pull oci:DIR reads it), once Build made it.
func (i Image) CachedLayout(o Options) (string, error) {
	cache, err := o.cacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(cache, i.cachePrefix()+i.Key()), nil
}
