package images

import (
	"archive/zip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/zyvor/kairon/internal/userimages"
)

// pythonRef pushes kairon/python:3.11 (built once into the shared image
// cache; make test builds it first) to a registry on loopback, pulls it
// into podman's store as a user would, and returns its reference there.
func pythonRef(t *testing.T) string {
	t.Helper()
	needRoot(t)
	preparePodman(t)
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	reg := strings.TrimPrefix(srv.URL, "http://")
	res, err := userimages.Python.Ensure(context.Background(), reg, userimages.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ref := res.Reference
	podman(t, "pull", "-q", "--tls-verify=false", ref)
	t.Cleanup(func() { _, _ = podmanErr("rmi", "--ignore", "-f", ref) })
	return ref
}

// inPython runs script with bash in a new container of the python image,
// as its default user, without a network, and returns its output.
func inPython(t *testing.T, ref string, extra []string, script string) string {
	t.Helper()
	args := append([]string{"run", "--rm", "--network=none"}, ulimits()...)
	args = append(args, extra...)
	args = append(args, ref, "bash", "-euo", "pipefail", "-c", script)
	out, err := podmanErr(args...)
	if err != nil {
		t.Fatalf("podman run %s -- %s: %v\noutput:\n%s", ref, script, err, out)
	}
	return out
}

// kairon/python in a real runtime: python3, pip, a venv, git and curl work
// for the non-root user kairon in its home, and that user's `pip install`
// works without a venv despite Debian's PEP 668 marker.
func TestPythonImageRunsInPodman(t *testing.T) {
	ref := pythonRef(t)
	out := inPython(t, ref, nil, `
id
pwd
python3 -c 'import ssl, sys; print("python", "%d.%d" % sys.version_info[:2], "cas", len(ssl.create_default_context().get_ca_certs()))'
pip --version
python3 -m venv /tmp/venv
/tmp/venv/bin/python -c 'import sys; print("venv", sys.prefix)'
/tmp/venv/bin/pip --version
git --version
curl --version | head -1
cd /tmp && git init -q repo && cd repo && echo hi > f && git add f && git -c user.name=k -c user.email=k@example.com commit -qm first && git log --format=commit:%s
sh -c 'echo sh works'
`)
	for _, want := range []string{
		"uid=1000(kairon) gid=1000(kairon) groups=1000(kairon)\n",
		"\n/home/kairon\n",
		"\npython 3.11 cas ",
		"\npip 23.0.1 from /usr/lib/python3/dist-packages/pip (python 3.11)\n",
		"\nvenv /tmp/venv\n",
		"from /tmp/venv/lib/python3.11/site-packages/pip (python 3.11)\n",
		"\ngit version 2.39",
		"\ncurl 7.88.1 ",
		"\ncommit:first\n",
		"\nsh works\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if i := strings.Index(out, " cas "); i >= 0 {
		n, _ := strconv.Atoi(strings.Fields(out[i+5:])[0])
		if n < 100 {
			t.Errorf("Python's default TLS context trusts %d certificates, want Debian's bundle (over 100)", n)
		}
	}

	// pip install for the user, from a wheel (no network): the package
	// imports and its command is on PATH.
	wheels := t.TempDir()
	writeWheel(t, filepath.Join(wheels, "kairon_hello-1.0-py3-none-any.whl"))
	out = inPython(t, ref, []string{"-v", wheels + ":/wheels:ro"}, `
pip install --no-index /wheels/kairon_hello-1.0-py3-none-any.whl
kairon-hello
python3 -c 'import kairon_hello; print(kairon_hello.__file__)'
`)
	for _, want := range []string{
		"Successfully installed kairon-hello-1.0",
		"\nhello from a wheel\n",
		"\n/home/kairon/.local/lib/python3.11/site-packages/kairon_hello/__init__.py\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("pip install as kairon: output lacks %q:\n%s", want, out)
		}
	}
}

// writeWheel writes a pure-Python wheel with one module and one console
// script, RECORD and all, as pip checks it.
func writeWheel(t *testing.T, file string) {
	t.Helper()
	files := [][2]string{
		{"kairon_hello/__init__.py", "def main():\n    print(\"hello from a wheel\")\n"},
		{"kairon_hello-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: kairon-hello\nVersion: 1.0\n"},
		{"kairon_hello-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: kairon-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
		{"kairon_hello-1.0.dist-info/entry_points.txt", "[console_scripts]\nkairon-hello = kairon_hello:main\n"},
	}
	var record strings.Builder
	for _, f := range files {
		sum := sha256.Sum256([]byte(f[1]))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f[0], base64.RawURLEncoding.EncodeToString(sum[:]), len(f[1]))
	}
	record.WriteString("kairon_hello-1.0.dist-info/RECORD,,\n")
	files = append(files, [2]string{"kairon_hello-1.0.dist-info/RECORD", record.String()})
	out, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	z := zip.NewWriter(out)
	for _, f := range files {
		w, err := z.Create(f[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(w, f[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
