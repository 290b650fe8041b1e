package images

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// maxZstdWindow bounds the memory a zstd layer may make its decoder take;
// zstd's own tools produce at most 8 MiB windows unless told otherwise.
const maxZstdWindow = 128 << 20

var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// layerFile is one layer, downloaded and checked against its digest.
type layerFile struct {
	path string
	// diffID is the digest of its uncompressed tar, from the image's
	// config (rootfs.diff_ids).
	diffID string
}

// openLayer returns a layer file's tar stream. The compression is read
// from the stream's first bytes, not from the manifest's media type, which
// tools have been known to get wrong; gzip, zstd and none are known.
func openLayer(p string) (io.Reader, func(), error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, nil, err
	}
	br := bufio.NewReaderSize(f, 1<<20)
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, gzipMagic):
		zr, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, nil, err
		}
		return zr, func() { zr.Close(); f.Close() }, nil
	case bytes.HasPrefix(magic, zstdMagic):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxZstdWindow), zstd.WithDecoderMaxMemory(maxZstdWindow))
		if err != nil {
			f.Close()
			return nil, nil, err
		}
		return zr, func() { zr.Close(); f.Close() }, nil
	}
	return br, func() { f.Close() }, nil
}

// budget is how many uncompressed bytes the layers of one image may still
// produce, shadowed content included: it stops a layer that decompresses
// without end before the tree's own limit could.
type budget struct {
	left  int64
	limit int64
}

// countingReader hashes what it reads and takes it from a budget.
type countingReader struct {
	r io.Reader
	h hash.Hash
	b *budget
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	c.b.left -= int64(n)
	if c.b.left < 0 {
		return n, errLimit{fmt.Sprintf("its layers decompress to more than %s", humanBytes(c.b.limit))}
	}
	return n, err
}

// scanLayer reads a layer file's tar stream from its start to its end,
// calling fn with each header (index counts every header the reader
// returns, so that a second scan finds the same entry under the same
// index) and a reader of its content. It returns the digest of the whole
// uncompressed stream, to compare with the layer's diffID.
func scanLayer(p string, b *budget, fn func(index int, h *tar.Header, content io.Reader) error) (string, error) {
	r, closeLayer, err := openLayer(p)
	if err != nil {
		return "", err
	}
	defer closeLayer()
	cr := &countingReader{r: r, h: sha256.New(), b: b}
	tr := tar.NewReader(cr)
	for i := 0; ; i++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", err
		}
		if err := fn(i, h, tr); err != nil {
			return "", err
		}
	}
	// The digest covers the tar's end-of-archive blocks too.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(cr.h.Sum(nil)), nil
}
