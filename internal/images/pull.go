package images

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sync/errgroup"

	"github.com/zyvor/kairon/internal/imagefs"
)

// parallelLayers is how many layers of one image download at once.
const parallelLayers = 3

// pull downloads the image res names, verifies it, converts it and adds
// it to the cache. Nothing it wrote stays behind when it fails.
func (s *Store) pull(ctx context.Context, ref string, p *puller, res *resolved) (*record, error) {
	log := s.log.WithValues("reference", ref, "digest", res.manifestDigest)
	m := res.manifest
	compressed := m.Config.Size
	for _, l := range m.Layers {
		compressed += l.Size
	}
	if compressed > s.opts.MaxCompressedBytes {
		return nil, pullErrorf(ref, ReasonTooLarge, "its layers are %s compressed, more than the node's limit of %s",
			humanBytes(compressed), humanBytes(s.opts.MaxCompressedBytes))
	}
	log.Info("pulling image", "layers", len(m.Layers), "compressedBytes", compressed)
	began := time.Now()
	start := began

	var raw bytes.Buffer
	if err := p.fetchBlob(ctx, ref, "config", m.Config.Digest, m.Config.Size, &raw); err != nil {
		return nil, err
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(raw.Bytes()))
	if err != nil {
		return nil, pullErrorf(ref, ReasonInvalidImage, "its config: %v", err)
	}
	if cf.OS != platformOS || cf.Architecture != platformArch {
		return nil, pullErrorf(ref, ReasonWrongPlatform, "it is built for %s/%s, and Kairon runs linux/amd64 images only", cf.OS, cf.Architecture)
	}
	if len(cf.RootFS.DiffIDs) != len(m.Layers) {
		return nil, pullErrorf(ref, ReasonInvalidImage, "its config lists %d diff IDs for %d layers", len(cf.RootFS.DiffIDs), len(m.Layers))
	}
	config, err := json.Marshal(imagefs.Config{
		Env:        cf.Config.Env,
		WorkingDir: cf.Config.WorkingDir,
		User:       cf.Config.User,
		Entrypoint: cf.Config.Entrypoint,
		Cmd:        cf.Config.Cmd,
		Digest:     res.manifestDigest,
		Reference:  ref,
	})
	if err != nil {
		return nil, err
	}
	if len(config) > imagefs.MaxConfigBytes {
		return nil, pullErrorf(ref, ReasonInvalidImage, "its config's environment and command are %d bytes, more than %d", len(config), imagefs.MaxConfigBytes)
	}

	layers := make([]layerFile, len(m.Layers))
	defer func() {
		for _, l := range layers {
			if l.path != "" {
				os.Remove(l.path)
			}
		}
	}()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallelLayers)
	for i, desc := range m.Layers {
		g.Go(func() error {
			f, err := os.CreateTemp(s.opts.Dir, tmpPrefix+"layer-*")
			if err != nil {
				return errOutput{err}
			}
			// Read by the deferred removal only after g.Wait.
			layers[i] = layerFile{path: f.Name(), diffID: cf.RootFS.DiffIDs[i].String()}
			err = p.fetchBlob(gctx, ref, fmt.Sprintf("layer %d", i+1), desc.Digest, desc.Size, outputWriter{f})
			if cerr := f.Close(); err == nil && cerr != nil {
				err = errOutput{cerr}
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		var outErr errOutput
		if errors.As(err, &outErr) {
			return nil, fmt.Errorf("images: saving a layer of %s: %w", ref, err)
		}
		return nil, err
	}
	s.metrics.PullDuration(time.Since(start))

	start = time.Now()
	tmp := filepath.Join(s.opts.Dir, tmpPrefix+imageFileName(res.manifestDigest)+fmt.Sprintf("-%d", time.Now().UnixNano()))
	defer os.Remove(tmp) // a no-op once renamed into place
	lim := flattenLimits{maxBytes: s.opts.MaxUncompressedBytes, maxNodes: s.opts.MaxFiles}
	err = writeSquashfs(ctx, tmp, func(w io.Writer) error { return flatten(layers, config, lim, w) })
	if err != nil {
		var lerr errLimit
		var ierr errInvalid
		switch {
		case errors.As(err, &lerr):
			return nil, pullErrorf(ref, ReasonTooLarge, "%s", lerr.what)
		case errors.As(err, &ierr):
			return nil, &PullError{Reference: ref, Reason: ReasonInvalidImage, Err: ierr}
		}
		return nil, fmt.Errorf("images: converting %s: %w", ref, err)
	}
	final := filepath.Join(s.opts.Dir, imageFileName(res.manifestDigest))
	size, err := finishFile(tmp, final)
	if err != nil {
		return nil, fmt.Errorf("images: converting %s: %w", ref, err)
	}
	s.metrics.ConvertDuration(time.Since(start))

	var ic imagefs.Config
	_ = json.Unmarshal(config, &ic)
	now := time.Now()
	r := &record{
		ManifestDigest: res.manifestDigest,
		References:     []string{ref},
		File:           imageFileName(res.manifestDigest),
		SizeBytes:      size,
		Public:         p.anonymous,
		Created:        now,
		LastUsed:       now,
		Config:         ic,
	}
	if res.digest != res.manifestDigest {
		r.Digests = []string{res.digest}
	}
	s.mu.Lock()
	s.addRecord(r)
	if err := s.saveLocked(); err != nil {
		// The image is complete and in the cache; only a restart would
		// forget it (and remove its file).
		log.Error(err, "writing the image cache index")
	}
	s.reportUsageLocked()
	s.mu.Unlock()
	log.Info("pulled image", "bytes", size, "seconds", time.Since(began).Seconds())
	return r, nil
}

// finishFile makes tmp read-only and durable and renames it to final, so
// that final is either absent or complete.
func finishFile(tmp, final string) (int64, error) {
	f, err := os.Open(tmp)
	if err != nil {
		return 0, err
	}
	err = f.Sync()
	fi, serr := f.Stat()
	f.Close()
	if err == nil {
		err = serr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o444)
	}
	if err == nil {
		err = os.Rename(tmp, final)
	}
	if err == nil {
		err = syncDir(filepath.Dir(final))
	}
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}
