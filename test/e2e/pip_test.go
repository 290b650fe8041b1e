package e2e

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/netlab"
	"github.com/zyvor/kairon/internal/userimages"
)

// The package indexes of TestPipInstallUnderTheSpecsEgress, in a namespace
// outside the nodes': PyPI's two names, and an index under another name.
const (
	pypiAddr  = "203.0.113.30"
	filesAddr = "203.0.113.31"
	otherAddr = "203.0.113.32"
)

// wheel is a pure-Python wheel of package name (kairon-hello: module
// kairon_hello) whose module holds greeting, with a correct RECORD.
func wheel(t *testing.T, module, version, greeting string) (file string, body []byte) {
	t.Helper()
	dist := module + "-" + version
	files := []struct{ name, body string }{
		{module + "/__init__.py", fmt.Sprintf("GREETING = %q\n", greeting)},
		{dist + ".dist-info/METADATA", fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\n", strings.ReplaceAll(module, "_", "-"), version)},
		{dist + ".dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: kairon-e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(f.body)); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString(dist + ".dist-info/RECORD,,\n")
	w, err := zw.Create(dist + ".dist-info/RECORD")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte(record.String())); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return dist + "-py3-none-any.whl", buf.Bytes()
}

// servePackageIndex serves a PEP 503 simple index of one project on
// indexHost whose files are on filesHost (the two may be one).
func servePackageIndex(t *testing.T, ns string, ca *netlab.CA, indexAddr, indexHost, filesAddr, filesHost, project, file string, body []byte) {
	t.Helper()
	sum := sha256.Sum256(body)
	page := fmt.Sprintf("<!DOCTYPE html><html><body><a href=\"https://%s/packages/%s#sha256=%s\">%s</a></body></html>\n", filesHost, file, hex.EncodeToString(sum[:]), file)
	index := http.NewServeMux()
	index.HandleFunc("/simple/"+project+"/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, page) })
	files := http.NewServeMux()
	files.HandleFunc("/packages/"+file, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) })
	if indexAddr == filesAddr {
		index.HandleFunc("/packages/"+file, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) })
		netlab.ServeHTTPS(t, ns, indexAddr+":443", ca.Issue(t, indexHost), index)
		return
	}
	netlab.ServeHTTPS(t, ns, indexAddr+":443", ca.Issue(t, indexHost), index)
	netlab.ServeHTTPS(t, ns, filesAddr+":443", ca.Issue(t, filesHost), files)
}

// TestPipInstallUnderTheSpecsEgress is the spec's per-claim egress example
// end to end: a claim from a warm pool of kairon/python:3.11 confined to
// pypi.org and files.pythonhosted.org on port 443 pip-installs a package
// from an index under those names (served in a namespace outside the
// nodes', TLS from a test CA handed to pip), then imports it; the same
// pip against an index under another name is refused.
func TestPipInstallUnderTheSpecsEgress(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	if _, err := userimages.Python.Ensure(ctx, reg.Addr, userimages.Options{}); err != nil {
		t.Fatalf("putting %s in the test registry: %v", userimages.Python.Name(), err)
	}
	netNS := netns(t)
	outside := netlab.Outside(t, netNS, []string{pypiAddr, filesAddr, otherAddr}, "10.88.0.0/16")
	netlab.ServeDNS(t, outside, outsideResolver, 30, map[string]string{
		"pypi.org": pypiAddr, "files.pythonhosted.org": filesAddr, "pypi.example.test": otherAddr,
	})
	ca := netlab.NewCA(t, "kairon e2e package index CA")
	file, body := wheel(t, "kairon_hello", "1.0", "hello from the index")
	servePackageIndex(t, outside, ca, pypiAddr, "pypi.org", filesAddr, "files.pythonhosted.org", "kairon-hello", file, body)
	servePackageIndex(t, outside, ca, otherAddr, "pypi.example.test", otherAddr, "pypi.example.test", "kairon-hello", file, body)

	// Not t.TempDir(): the VMs' unix sockets must fit in 108 bytes.
	state, err := os.MkdirTemp("", "kpip-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(state) })
	t.Cleanup(func() { killVMs(t, state) })
	nodeName := ns + "-pip"
	startController(t, env)
	a := restartEgressAgent(t, env, nodeName, filepath.Join(state, "a"), netNS, 6)
	deleteNodeAtEnd(t, env, nodeName)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := os.ReadFile(a.log)
			t.Logf("kairon-node log:\n%s", tail(string(out), 60))
			t.Logf("objects:\n%s", kubectlQuiet(env, "-n", ns, "get", "machinepools,machineclaims,machines,events", "-o", "wide"))
		}
	})

	env.KubectlStdin(t, fmt.Sprintf(`apiVersion: kairon.zyvor.dev/v1alpha1
kind: MachinePool
metadata: {name: python}
spec:
  replicas: 1
  template:
    spec: {cpu: 1, memory: 768Mi, image: %q}
`, reg.Ref(userimages.Python.Name())), "-n", ns, "apply", "-f", "-")
	testenv.Eventually(t, 8*time.Minute, "a Running warm member of the python pool", func() (bool, string) {
		out := jsonpathQuiet(env, testenv.Query{Namespace: ns, Resource: "machines", LabelSelector: kaironv1.LabelPoolState + "=" + kaironv1.PoolStateWarm}, "{.items[*].status.phase} {.items[*].status.conditions[?(@.type==\"Ready\")].message}")
		return strings.HasPrefix(out, "Running"), out
	})
	env.KubectlStdin(t, `apiVersion: kairon.zyvor.dev/v1alpha1
kind: MachineClaim
metadata: {name: agent}
spec:
  poolName: python
  egress:
    allowFqdns: [pypi.org, files.pythonhosted.org]
    allowPorts: ["443"]
`, "-n", ns, "apply", "-f", "-")
	claim := &kaironv1.MachineClaim{}
	testenv.Eventually(t, 2*time.Minute, "claim agent Bound", func() (bool, string) {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "agent"}, claim); err != nil {
			return false, err.Error()
		}
		return claim.Status.Phase == kaironv1.ClaimBound, fmt.Sprintf("%s %v", claim.Status.Phase, claim.Status.Conditions)
	})
	machine := claim.Status.MachineName

	kaironctl := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(filepath.Join(env.BinDir, "kaironctl"), append([]string{"--kubeconfig", env.Kubeconfig, "-n", ns}, args...)...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), code
	}
	// The image's user, with its home, and pip at hand.
	if out, code := kaironctl("exec", machine, "--", "sh", "-c", "id -un; echo $HOME; pwd"); code != 0 || out != "kairon\n/home/kairon\n/home/kairon\n" {
		t.Errorf("exec as the image's user: exit %d: %q, want kairon, its home, working there", code, out)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := kaironctl("cp", caFile, machine+":/tmp/index-ca.pem"); code != 0 {
		t.Fatalf("cp of the CA: %s", out)
	}
	pip := func(index string) (string, int) {
		return kaironctl("exec", machine, "--", "pip", "install", "--no-cache-dir", "--disable-pip-version-check",
			"--timeout", "10", "--retries", "0", "--cert", "/tmp/index-ca.pem", "--index-url", "https://"+index+"/simple/", "kairon-hello")
	}
	if out, code := pip("pypi.org"); code != 0 {
		t.Fatalf("pip install from pypi.org under the claim's egress: exit %d:\n%s", code, out)
	}
	if out, code := kaironctl("exec", machine, "--", "python3", "-c", "import kairon_hello; print(kairon_hello.GREETING)"); code != 0 || out != "hello from the index\n" {
		t.Errorf("importing the installed package: exit %d: %q", code, out)
	}
	if out, code := kaironctl("exec", machine, "--", "pip", "uninstall", "-y", "kairon-hello"); code != 0 {
		t.Fatalf("pip uninstall: exit %d:\n%s", code, out)
	}
	out, code := pip("pypi.example.test")
	if code == 0 {
		t.Fatalf("pip install from an index the claim does not allow succeeded:\n%s", out)
	}
	if !strings.Contains(out, "No matching distribution") && !strings.Contains(out, "Failed to establish a new connection") {
		t.Errorf("pip against pypi.example.test failed, but not for want of reaching it:\n%s", out)
	}
}
