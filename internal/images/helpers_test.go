package images

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// file is one entry of a test layer.
type file struct {
	name     string
	typ      byte // tar.TypeReg unless set
	body     string
	mode     int64
	uid, gid int
	link     string
	xattrs   map[string]string
	dev      [2]int64
}

// tarOf writes files as an uncompressed tar stream.
func tarOf(t testing.TB, files ...file) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Typeflag: f.typ, Mode: f.mode, Uid: f.uid, Gid: f.gid, Linkname: f.link,
			ModTime: time.Unix(1700000000, 0), Devmajor: f.dev[0], Devminor: f.dev[1]}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(f.body))
		}
		if len(f.xattrs) > 0 {
			h.Format = tar.FormatPAX
			h.PAXRecords = map[string]string{}
			for k, v := range f.xattrs {
				h.PAXRecords["SCHILY.xattr."+k] = v
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("tar header %s: %v", f.name, err)
		}
		if _, err := tw.Write([]byte(f.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// layerOf is a gzip layer of files.
func layerOf(t testing.TB, files ...file) v1.Layer {
	t.Helper()
	b := tarOf(t, files...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// imageOf is an OCI linux/amd64 image of layers with config c.
func imageOf(t testing.TB, c v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	return imageFor(t, "linux", "amd64", c, layers...)
}

func imageFor(t testing.TB, os, arch string, c v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = os, arch, c
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// newStore opens a store in a new temporary directory, closed at cleanup.
func newStore(t testing.TB, o Options) *Store {
	t.Helper()
	if o.Dir == "" {
		o.Dir = filepath.Join(t.TempDir(), "images")
	}
	o.Log = testr.NewWithInterface(t, testr.Options{})
	s, err := NewStore(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// startRegistry starts a registry for t, skipping under -short.
func startRegistry(t testing.TB, opts testenv.RegistryOptions) *testenv.Registry {
	t.Helper()
	host.SkipIfShort(t, "a registry (docker-registry) on loopback")
	return testenv.StartRegistry(t, opts)
}

// countingProxy is a reverse proxy on loopback in front of a registry that
// counts the requests it passes, by method and path.
type countingProxy struct {
	Addr string
	mu   sync.Mutex
	reqs []string
}

func newCountingProxy(t testing.TB, registryAddr string) *countingProxy {
	t.Helper()
	target, _ := url.Parse("http://" + registryAddr)
	p := &countingProxy{}
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.reqs = append(p.reqs, r.Method+" "+r.URL.Path)
		p.mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.Addr = strings.TrimPrefix(srv.URL, "http://")
	return p
}

// count is how many requests so far had method and a path containing part.
func (p *countingProxy) count(method, part string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, r := range p.reqs {
		if strings.HasPrefix(r, method+" ") && strings.Contains(r, part) {
			n++
		}
	}
	return n
}

func (p *countingProxy) total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.reqs)
}

// listing is one line of unsquashfs -lln: mode, uid/gid, size, path and a
// symlink's target.
type listing struct {
	mode, owner, size, target string
}

// listSquashfs lists an image file with unsquashfs -lln, by path relative
// to the filesystem's root ("" for the root itself).
func listSquashfs(t testing.TB, path string) map[string]listing {
	t.Helper()
	out, err := exec.Command("unsquashfs", "-lln", "-d", "R", path).Output()
	if err != nil {
		t.Fatalf("unsquashfs -lln %s: %v", path, err)
	}
	m := map[string]listing{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 {
			continue
		}
		p := strings.Join(f[5:], " ")
		var target string
		if i := strings.Index(p, " -> "); i >= 0 {
			p, target = p[:i], p[i+4:]
		}
		if p != "R" && !strings.HasPrefix(p, "R/") {
			continue
		}
		m[strings.TrimPrefix(strings.TrimPrefix(p, "R"), "/")] = listing{mode: f[0], owner: f[1], size: f[2], target: target}
	}
	return m
}

// catSquashfs returns the content of p in an image file.
func catSquashfs(t testing.TB, path, p string) string {
	t.Helper()
	out, err := exec.Command("unsquashfs", "-cat", path, p).Output()
	if err != nil {
		t.Fatalf("unsquashfs -cat %s %s: %v", path, p, err)
	}
	return string(out)
}

// cacheFiles lists the cache directory, the lock file excepted.
func cacheFiles(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if e.Name() != lockFile {
			names = append(names, e.Name())
		}
	}
	return names
}

// dockerConfig is a .dockerconfigjson for user and password at addr.
func dockerConfig(addr, user, password string) []byte {
	return []byte(fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, addr, basicAuth(user, password)))
}

func keychainFor(t testing.TB, addr, user, password string) authn.Keychain {
	t.Helper()
	kc, err := KeychainFromDockerConfigs(dockerConfig(addr, user, password))
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
