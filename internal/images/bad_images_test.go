package images

import (
	"archive/tar"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/zyvor/kairon/internal/testenv"
)

// TestBadImages pulls images the store must refuse, each with the reason
// and a message naming the reference and the cause, and checks that
// nothing of the attempt stays in the cache directory.
func TestBadImages(t *testing.T) {
	reg := startRegistry(t, testenv.RegistryOptions{})
	random := make([]byte, 8<<10)
	if _, err := rand.Read(random); err != nil {
		t.Fatal(err)
	}
	ok := layerOf(t, file{name: "ok", body: "fine"})

	for _, tc := range []struct {
		name   string
		opts   Options
		push   func(t *testing.T, repoTag string) // pushes the image as repoTag
		reason Reason
		says   []string
	}{
		{name: "wrong platform", reason: ReasonWrongPlatform,
			push: func(t *testing.T, repoTag string) {
				reg.Push(t, repoTag, imageFor(t, "linux", "arm64", v1.Config{}, ok))
			},
			says: []string{"wrong platform: it is built for linux/arm64, and Kairon runs linux/amd64 images only"}},
		{name: "index without linux/amd64", reason: ReasonWrongPlatform,
			push: func(t *testing.T, repoTag string) {
				idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
					mutate.IndexAddendum{Add: imageFor(t, "linux", "arm64", v1.Config{}, ok), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
					mutate.IndexAddendum{Add: imageFor(t, "linux", "arm", v1.Config{}, ok), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm", Variant: "v7"}}},
					mutate.IndexAddendum{Add: imageFor(t, "windows", "amd64", v1.Config{}, ok), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "windows", Architecture: "amd64"}}},
				)
				reg.PushIndex(t, repoTag, idx)
			},
			says: []string{"it is built for linux/arm/v7, linux/arm64, windows/amd64, and Kairon runs linux/amd64 images only"}},
		{name: "too large compressed", reason: ReasonTooLarge, opts: Options{MaxCompressedBytes: 4 << 10},
			push: func(t *testing.T, repoTag string) {
				reg.Push(t, repoTag, imageOf(t, v1.Config{}, layerOf(t, file{name: "noise", body: string(random)})))
			},
			says: []string{"too large: its layers are 8.", "KiB compressed, more than the node's limit of 4.0 KiB"}},
		{name: "too large uncompressed", reason: ReasonTooLarge, opts: Options{MaxUncompressedBytes: 1 << 20},
			push: func(t *testing.T, repoTag string) {
				reg.Push(t, repoTag, imageOf(t, v1.Config{}, ok, layerOf(t, file{name: "zeros", body: strings.Repeat("\x00", 3<<20)})))
			},
			says: []string{"too large: its files hold at least 3.0 MiB uncompressed (by layer 2 of 2), more than the node's limit of 1.0 MiB"}},
		{name: "too many files", reason: ReasonTooLarge, opts: Options{MaxFiles: 3},
			push: func(t *testing.T, repoTag string) {
				reg.Push(t, repoTag, imageOf(t, v1.Config{}, layerOf(t, file{name: "a"}, file{name: "b"}, file{name: "c"}, file{name: "d"})))
			},
			says: []string{"too large: a layer lists more than 3 files"}},
		{name: "device node", reason: ReasonInvalidImage,
			push: func(t *testing.T, repoTag string) {
				reg.Push(t, repoTag, imageOf(t, v1.Config{}, ok, layerOf(t, file{name: "dev/sda", typ: tar.TypeBlock, dev: [2]int64{8, 0}})))
			},
			says: []string{`invalid image: layer 2: "dev/sda" is a block device node (8, 0); images may not hold device nodes`}},
		{name: "path escaping the root", reason: ReasonInvalidImage,
			push: func(t *testing.T, repoTag string) {
				reg.Push(t, repoTag, imageOf(t, v1.Config{}, layerOf(t, file{name: "../../etc/cron.d/evil", body: "* * * * * root sh"})))
			},
			says: []string{`invalid image: layer 1: "../../etc/cron.d/evil" leaves the image's root`}},
		{name: "hard link escaping the root", reason: ReasonInvalidImage,
			push: func(t *testing.T, repoTag string) {
				reg.Push(t, repoTag, imageOf(t, v1.Config{}, layerOf(t, file{name: "shadow", typ: tar.TypeLink, link: "../../../etc/shadow"})))
			},
			says: []string{`layer 1: hard link "shadow": target: "../../../etc/shadow" leaves the image's root`}},
		{name: "hard link to nothing", reason: ReasonInvalidImage,
			push: func(t *testing.T, repoTag string) {
				reg.Push(t, repoTag, imageOf(t, v1.Config{}, layerOf(t, file{name: "passwd", typ: tar.TypeLink, link: "etc/passwd"})))
			},
			says: []string{`layer 1: hard link "passwd": its target "etc/passwd" is not a file earlier in the image`}},
		{name: "tampered layer", reason: ReasonInvalidImage,
			push: func(t *testing.T, repoTag string) {
				l := layerOf(t, file{name: "app", body: strings.Repeat("genuine ", 64)})
				reg.Push(t, repoTag, imageOf(t, v1.Config{}, l))
				d, _ := l.Digest()
				tamper(t, reg, d)
			},
			says: []string{"invalid image: layer 1 sha256:", "the registry sent content whose digest is sha256:"}},
		{name: "diff ID that does not match", reason: ReasonInvalidImage,
			push: func(t *testing.T, repoTag string) {
				img := imageOf(t, v1.Config{}, ok)
				cf, _ := img.ConfigFile()
				cf = cf.DeepCopy()
				cf.RootFS.DiffIDs[0] = v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("0", 64)}
				img, err := mutate.ConfigFile(img, cf)
				if err != nil {
					t.Fatal(err)
				}
				reg.Push(t, repoTag, img)
			},
			says: []string{"invalid image: layer 1: its content's digest is sha256:", "not the diff ID sha256:0000"}},
		{name: "not a container image", reason: ReasonInvalidImage,
			push: func(t *testing.T, repoTag string) {
				reg.Push(t, repoTag, mutate.ConfigMediaType(imageOf(t, v1.Config{}, ok), "application/vnd.cncf.helm.config.v1+json"))
			},
			says: []string{`invalid image: the image manifest: it is not a container image: its config is "application/vnd.cncf.helm.config.v1+json"`}},
		{name: "not a tar", reason: ReasonInvalidImage,
			push: func(t *testing.T, repoTag string) {
				reg.Push(t, repoTag, imageOf(t, v1.Config{}, rawLayer(t, []byte(strings.Repeat("not a tar archive ", 100)))))
			},
			says: []string{"invalid image: layer 1:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repoTag := "bad/" + strings.ToLower(strings.NewReplacer(" ", "-", "/", "-").Replace(tc.name)) + ":1"
			tc.push(t, repoTag)
			s := newStore(t, tc.opts)
			ref := reg.Ref(repoTag)
			_, err := s.Ensure(ctxFor(t), ref, nil)
			wantPullError(t, err, tc.reason, append([]string{ref + ": "}, tc.says...)...)
			if files := cacheFiles(t, s.opts.Dir); len(files) != 0 {
				t.Fatalf("the cache directory holds %v after the refusal", files)
			}
		})
	}
}

// tamper changes one byte of a blob in the registry's storage, keeping
// its size: the registry serves it under its old digest.
func tamper(t *testing.T, reg *testenv.Registry, d v1.Hash) {
	t.Helper()
	p := filepath.Join(reg.Dir, "docker/registry/v2/blobs", d.Algorithm, d.Hex[:2], d.Hex, "data")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
