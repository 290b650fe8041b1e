package userimages

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/zyvor/kairon/internal/testenv/host"
)

// pythonImage builds kairon/python into the shared cache (once per
// machine and lock; make test builds it first, so the tests download
// nothing).
func pythonImage(t *testing.T) v1.Image {
	t.Helper()
	host.SkipIfShort(t, "apt-get and dpkg-deb with the Debian archive's package lists")
	img, _, err := Python.Build(context.Background(), Options{Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// layerFiles reads the image's files (one layer), keeping the content of
// those in want.
func layerFiles(t *testing.T, img v1.Image, want ...string) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v; want 1", len(layers), err)
	}
	compressed, err := layers[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer compressed.Close()
	// gzip, not compress/gzip: under the race detector this is a
	// tenth of the time.
	gunzip := exec.Command("gzip", "-dc")
	gunzip.Stdin = compressed
	rc, err := gunzip.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := gunzip.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = io.Copy(io.Discard, rc); _ = gunzip.Wait() }()
	headers, contents := map[string]*tar.Header{}, map[string][]byte{}
	keep := map[string]bool{}
	for _, w := range want {
		keep[w] = true
	}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return headers, contents
		}
		if err != nil {
			t.Fatal(err)
		}
		n := strings.TrimSuffix(h.Name, "/")
		headers[n] = h
		if keep[n] {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			contents[n] = b
		}
	}
}

// The image runs as kairon in its home with no entrypoint, and holds what
// the skipped maintainer scripts would have made: accounts, the CA bundle,
// pip's permission to install for the user, compiled Python modules whose
// headers match the sources' date, and ldconfig's cache.
func TestPythonImageContent(t *testing.T) {
	img := pythonImage(t)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "1000:1000" || c.WorkingDir != "/home/kairon" || len(c.Entrypoint) != 0 || len(c.Cmd) != 0 {
		t.Errorf("config: user %q, workdir %q, entrypoint %q, cmd %q; want 1000:1000, /home/kairon, none", c.User, c.WorkingDir, c.Entrypoint, c.Cmd)
	}
	if !strings.Contains(strings.Join(c.Env, " "), "PATH=/home/kairon/.local/bin:") || c.Labels[KeyLabel] != Python.Key() {
		t.Errorf("config: env %q, key label %q (want %s)", c.Env, c.Labels[KeyLabel], Python.Key())
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	lock, err := Python.Lock()
	if err != nil {
		t.Fatal(err)
	}
	h, files := layerFiles(t, img, "etc/passwd", "etc/pip.conf", "etc/ssl/certs/ca-certificates.crt",
		"usr/lib/python3.11/__pycache__/os.cpython-311.pyc", "usr/lib/python3.11/os.py", "var/lib/dpkg/status")
	if !strings.Contains(string(files["etc/passwd"]), "\nkairon:x:1000:1000:Kairon:/home/kairon:/bin/bash\n") {
		t.Errorf("/etc/passwd:\n%s", files["etc/passwd"])
	}
	if home := h["home/kairon"]; home == nil || home.Uid != 1000 || home.Gid != 1000 {
		t.Errorf("/home/kairon: %+v", home)
	}
	if !strings.Contains(string(files["etc/pip.conf"]), "break-system-packages = true") {
		t.Errorf("/etc/pip.conf:\n%s", files["etc/pip.conf"])
	}
	if n := bytes.Count(files["etc/ssl/certs/ca-certificates.crt"], []byte("-----BEGIN CERTIFICATE-----")); n < 100 {
		t.Errorf("the CA bundle holds %d certificates", n)
	}
	for link, target := range map[string]string{"usr/bin/python3": "python3.11", "bin": "usr/bin", "usr/bin/awk": "/etc/alternatives/awk", "usr/bin/sh": "dash"} {
		if l := h[link]; l == nil || l.Linkname != target {
			t.Errorf("/%s: %+v, want a link to %s", link, l, target)
		}
	}
	for _, f := range []string{"etc/ld.so.cache", "etc/nsswitch.conf", "etc/shells", "etc/shadow", "usr/bin/git", "usr/bin/curl", "usr/lib/python3.11/venv/__init__.py", "var/lib/dpkg/info/bash.list"} {
		if _, ok := h[f]; !ok {
			t.Errorf("/%s is missing", f)
		}
	}
	if _, ok := h["usr/share/man/man1/bash.1.gz"]; ok {
		t.Error("manual pages were not left out")
	}
	// A .pyc records its source's mtime and size (bytes 8-16); Python uses
	// it only if both match.
	pyc, src := files["usr/lib/python3.11/__pycache__/os.cpython-311.pyc"], files["usr/lib/python3.11/os.py"]
	if len(pyc) < 16 || int64(binary.LittleEndian.Uint32(pyc[8:])) != lock.Date.Unix() || int(binary.LittleEndian.Uint32(pyc[12:])) != len(src) {
		t.Errorf("os.pyc's header does not match os.py (mtime %d, %d bytes)", lock.Date.Unix(), len(src))
	}
	if !bytes.Contains(pyc, []byte("/usr/lib/python3.11/os.py")) || bytes.Contains(pyc, []byte(".cache")) {
		t.Error("os.pyc does not name its source by its path in the image")
	}
	for _, p := range lock.Packages {
		if !bytes.Contains(files["var/lib/dpkg/status"], []byte("Package: "+p.Name+"\nStatus: install ok installed\n")) {
			t.Errorf("dpkg status lacks %s", p.Name)
		}
	}
}

// A build from scratch (its own cache, the packages already downloaded),
// by the command benchmarks use, gives the bytes of the shared cache's
// build.
func TestPythonImageIsReproducible(t *testing.T) {
	img := pythonImage(t)
	want, _ := img.Digest()
	shared, err := DefaultCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	if err := os.MkdirAll(filepath.Join(cache, "debs"), 0o755); err != nil {
		t.Fatal(err)
	}
	debs, _ := filepath.Glob(filepath.Join(shared, "debs", "*.deb"))
	for _, d := range debs {
		if err := os.Link(d, filepath.Join(cache, "debs", filepath.Base(d))); err != nil {
			t.Fatal(err)
		}
	}
	// Outside the race detector, which would take minutes over it.
	cmd := exec.Command("go", "run", "./hack/images", "python", "--cache", cache)
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go run ./hack/images python: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "built kairon/python:3.11") {
		t.Errorf("go run ./hack/images python did not build:\n%s", stderr.String())
	}
	fields := strings.Fields(string(out))
	if len(fields) != 3 || fields[0] != "kairon/python:3.11" || fields[1] != want.String() {
		t.Errorf("second build printed %q; the shared cache's build is %s", out, want)
	}
}
