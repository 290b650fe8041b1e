package images

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/zyvor/kairon/internal/testenv"
)

// benchTree is the image BenchmarkEnsure pulls: the host's Python 3.11
// and git's helpers on top of a base of /etc, time zones and the
// libraries Python links, about 150 MB in two layers, as
// testdata/measure-formats.sh measures (the same files).
var benchTree = [][]string{
	{"etc", "usr/share/zoneinfo", "usr/lib/x86_64-linux-gnu/libc.so.6", "usr/lib/x86_64-linux-gnu/libcrypto.so.3",
		"usr/lib/x86_64-linux-gnu/libssl.so.3", "usr/lib/x86_64-linux-gnu/libsqlite3.so.0.8.6", "usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30"},
	{"usr/lib/python3", "usr/lib/python3.11", "usr/lib/git-core", "usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0"},
}

// BenchmarkEnsure pulls and converts a realistic image with a cold cache
// (a new store each time), then with a warm one (the tag resolved, the
// image found). Run it alone, on an idle machine:
//
//	go test -run '^$' -bench Ensure -benchtime 3x ./internal/images/
func BenchmarkEnsure(b *testing.B) {
	reg := startRegistry(b, testenv.RegistryOptions{})
	var layers []v1.Layer
	var treeBytes int64
	for _, paths := range benchTree {
		tb, n := hostTar(b, paths)
		treeBytes += n
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tb)), nil },
			tarball.WithMediaType(types.OCILayer))
		if err != nil {
			b.Fatal(err)
		}
		layers = append(layers, l)
	}
	reg.Push(b, "bench/python:3.11", imageOf(b, v1.Config{Cmd: []string{"python3"}}, layers...))
	var compressed int64
	for _, l := range layers {
		n, _ := l.Size()
		compressed += n
	}
	ref := reg.Ref("bench/python:3.11")
	ctx := context.Background()

	b.Run("cold", func(b *testing.B) {
		m := &timingMetrics{}
		var size int64
		for b.Loop() {
			dir := filepath.Join(b.TempDir(), "images")
			s := newStore(b, Options{Dir: dir, Metrics: m})
			img, err := s.Ensure(ctx, ref, nil)
			if err != nil {
				b.Fatal(err)
			}
			size = img.SizeBytes
			s.Close()
			os.RemoveAll(dir)
		}
		b.ReportMetric(float64(treeBytes), "tree-bytes")
		b.ReportMetric(float64(compressed), "compressed-bytes")
		b.ReportMetric(float64(size), "squashfs-bytes")
		b.ReportMetric(m.pull.Seconds()/float64(m.n), "pull-s/op")
		b.ReportMetric(m.convert.Seconds()/float64(m.n), "convert-s/op")
	})
	b.Run("warm", func(b *testing.B) {
		s := newStore(b, Options{})
		if _, err := s.Ensure(ctx, ref, nil); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := s.Ensure(ctx, ref, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// hostTar tars host paths (relative to /) with numeric owners, and
// returns the tar and the bytes of its regular files.
func hostTar(b *testing.B, paths []string) ([]byte, int64) {
	b.Helper()
	var buf bytes.Buffer
	var n int64
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		err := filepath.WalkDir("/"+p, func(fp string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			link := ""
			if fi.Mode()&fs.ModeSymlink != 0 {
				if link, err = os.Readlink(fp); err != nil {
					return err
				}
			}
			h, err := tar.FileInfoHeader(fi, link)
			if err != nil {
				return err
			}
			h.Name, h.Uname, h.Gname = strings.TrimPrefix(fp, "/"), "", ""
			if d.IsDir() {
				h.Name += "/"
			}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if fi.Mode().IsRegular() {
				f, err := os.Open(fp)
				if err != nil {
					return err
				}
				defer f.Close()
				c, err := io.Copy(tw, f)
				n += c
				return err
			}
			return nil
		})
		if err != nil {
			b.Fatalf("tar of /%s: %v", p, err)
		}
	}
	if err := tw.Close(); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes(), n
}

// timingMetrics adds up the pull and conversion times.
type timingMetrics struct {
	mu            sync.Mutex
	pull, convert time.Duration
	n             int
}

func (m *timingMetrics) PullDuration(d time.Duration) {
	m.mu.Lock()
	m.pull += d
	m.n++
	m.mu.Unlock()
}
func (m *timingMetrics) ConvertDuration(d time.Duration) {
	m.mu.Lock()
	m.convert += d
	m.mu.Unlock()
}
func (m *timingMetrics) CacheHit()             {}
func (m *timingMetrics) CacheMiss()            {}
func (m *timingMetrics) PullFailed(Reason)     {}
func (m *timingMetrics) CacheUsage(int, int64) {}
