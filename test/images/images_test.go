// Package images tests Kairon's OCI images (hack/images, make images) in a
// real container runtime, Debian's podman: the controller image runs
// kairon-controller as a non-root user against a real API server and
// reconciles a MachineSet; the node image runs kairon-node privileged on the
// host's network and PID namespace, boots a QEMU guest that answers, and
// that guest keeps running, on the same PID, through a `podman restart` of
// the agent's container, after which the new agent re-adopts it.
//
// The tests need root (podman, cgroups, network namespaces) and skip
// without it, and with -short.
package images

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
	"github.com/zyvor/kairon/internal/testenv/netlab"
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m))
}

var imageNames = []string{"kairon-controller", "kairon-ui", "kairon-node"}

// built is the one build of the images the tests share.
var built struct {
	once     sync.Once
	dir      string // the repository's bin/images
	refs     map[string]string
	epoch    string // SOURCE_DATE_EPOCH of the build
	revision string // the commit it records
	tree     string // treeFingerprint before it
	err      error
}

func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// needRoot skips a test that cannot run here, saying why.
func needRoot(t testing.TB) {
	t.Helper()
	host.SkipIfShort(t, "root, podman, QEMU and a control plane")
	if os.Geteuid() != 0 {
		t.Skip("test/images needs root: podman runs the images rootful, and the node image needs privileges, cgroups and network namespaces (run make test as root)")
	}
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatal("podman not found: install Debian's podman (make deps does)")
	}
}

// buildImages runs the image build (what `make images` runs) once into
// bin/images, and returns that directory and each image's reference.
func buildImages(t testing.TB) (string, map[string]string) {
	t.Helper()
	needRoot(t)
	built.once.Do(func() {
		root := repoRoot(t)
		built.dir = filepath.Join(root, "bin", "images")
		// The last commit's time and hash, as make images takes them, but
		// fixed for this test run: others may commit meanwhile.
		out, err := exec.Command("git", "-C", root, "log", "-1", "--format=%ct").Output()
		if err != nil {
			built.err = fmt.Errorf("git log: %v", err)
			return
		}
		built.epoch = strings.TrimSpace(string(out))
		rev, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
		if err != nil {
			built.err = fmt.Errorf("git rev-parse: %v", err)
			return
		}
		built.revision = strings.TrimSpace(string(rev))
		built.tree = treeFingerprint(root)
		built.refs, built.err = runBuild(root, built.dir, filepath.Join(testenv.BinDir(t), "guest"))
	})
	if built.err != nil {
		t.Fatalf("building the images: %v", built.err)
	}
	return built.dir, built.refs
}

var builtLine = regexp.MustCompile(`^(\S+)\t(sha256:[0-9a-f]{64})\t(\S+)$`)

// runBuild runs hack/images in the repository root into out and returns
// the reference of each image built.
func runBuild(root, out, guestDir string) (map[string]string, error) {
	cmd := exec.Command("go", "run", "./hack/images", "--out", out, "--guest-dir", guestDir,
		"--deb-cache", filepath.Join(root, "bin", "images", "debs"), "--revision", built.revision)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+built.epoch)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go run ./hack/images: %v\n%s", err, stderr.String())
	}
	refs := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(stdout)), "\n") {
		m := builtLine.FindStringSubmatch(l)
		if m == nil {
			return nil, fmt.Errorf("unexpected output line %q", l)
		}
		name := filepath.Base(m[3])
		refs[strings.TrimSuffix(name, ".oci.tar")] = m[1]
	}
	return refs, nil
}

// chartImages reads the chart's default image references: image.registry
// and the chart's appVersion (image.tag defaults to it).
func chartImages(t testing.TB) (registry, tag string) {
	t.Helper()
	root := repoRoot(t)
	values, err := os.ReadFile(filepath.Join(root, "charts/kairon/values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	chart, err := os.ReadFile(filepath.Join(root, "charts/kairon/Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	r := regexp.MustCompile(`(?m)^image:\n(?:  .*\n)*?  registry: (\S+)`).FindSubmatch(values)
	v := regexp.MustCompile(`(?m)^appVersion: "?([^"\s]+)"?`).FindSubmatch(chart)
	if r == nil || v == nil {
		t.Fatalf("no image.registry in values.yaml or no appVersion in Chart.yaml")
	}
	return string(r[1]), string(v[1])
}

// treeFingerprint hashes what the builds read from the checkout: HEAD,
// the uncommitted changes and the untracked files.
func treeFingerprint(root string) string {
	h := sha256.New()
	for _, args := range [][]string{{"rev-parse", "HEAD"}, {"diff", "HEAD"}, {"ls-files", "--others", "--exclude-standard"}} {
		out, _ := exec.Command("git", append([]string{"-C", root}, args...)...).Output()
		h.Write(out)
		if args[0] == "ls-files" {
			for _, f := range strings.Fields(string(out)) {
				b, _ := os.ReadFile(filepath.Join(root, f))
				h.Write(b)
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Two builds of one checkout give the same bytes, and the images are named
// as the chart's defaults refer to them.
func TestImagesAreReproducibleAndNamedAsTheChartsDefaults(t *testing.T) {
	dir, refs := buildImages(t)
	registry, tag := chartImages(t)
	for _, n := range imageNames {
		if want := registry + "/" + n + ":" + tag; refs[n] != want {
			t.Errorf("%s built as %q; the chart's default is %q", n, refs[n], want)
		}
		idx := readLayoutFile(t, filepath.Join(dir, n+".oci.tar"), "index.json")
		var index struct {
			Manifests []struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		if err := json.Unmarshal(idx, &index); err != nil || len(index.Manifests) != 1 {
			t.Fatalf("%s: index.json: %v %s", n, err, idx)
		}
		if got := index.Manifests[0].Annotations["org.opencontainers.image.ref.name"]; got != refs[n] {
			t.Errorf("%s: ref.name annotation %q, want %q", n, got, refs[n])
		}
	}

	// Again, into another directory. Binaries are built from the work tree,
	// so this compares two builds of whatever it holds now.
	again := t.TempDir()
	if _, err := runBuild(repoRoot(t), again, filepath.Join(testenv.BinDir(t), "guest")); err != nil {
		t.Fatal(err)
	}
	if now := treeFingerprint(repoRoot(t)); now != built.tree {
		t.Skip("the work tree changed between the two builds (someone edited or committed meanwhile), so they need not be the same; run again on a quiet tree")
	}
	for _, n := range imageNames {
		a, b := testenv.FileSHA256(t, filepath.Join(dir, n+".oci.tar")), testenv.FileSHA256(t, filepath.Join(again, n+".oci.tar"))
		if a != b {
			t.Errorf("%s: two builds differ: sha256 %s and %s; layers %v and %v (a file changed between them, or something in the build is not fixed)",
				n, a, b, layerDigests(t, filepath.Join(dir, n+".oci.tar")), layerDigests(t, filepath.Join(again, n+".oci.tar")))
		}
	}
}

// withLayoutFile calls read with the content of the file name in an OCI
// layout tarball, and says whether there was one. The tarball is read from
// its file, so that tar seeks past the other blobs instead of reading them:
// copying the node image's ~100 MB through the race detector's
// instrumentation is what made these tests slow.
func withLayoutFile(t testing.TB, tarball, name string, read func(io.Reader)) bool {
	t.Helper()
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg && strings.TrimPrefix(h.Name, "./") == name {
			read(tr)
			return true
		}
	}
}

// layoutFile reads one small file of an OCI layout tarball; nil if there
// is none.
func layoutFile(t testing.TB, tarball, name string) []byte {
	t.Helper()
	var b []byte
	withLayoutFile(t, tarball, name, func(r io.Reader) {
		var err error
		if b, err = io.ReadAll(r); err != nil {
			t.Fatal(err)
		}
	})
	return b
}

func readLayoutFile(t testing.TB, tarball, name string) []byte {
	t.Helper()
	b := layoutFile(t, tarball, name)
	if b == nil {
		t.Fatalf("%s: no %s", tarball, name)
	}
	return b
}

func blobName(digest string) string { return "blobs/sha256/" + strings.TrimPrefix(digest, "sha256:") }

// layerDigests lists the digests of the config and layers of the one
// image in an OCI layout tarball, shortened.
func layerDigests(t testing.TB, tarball string) []string {
	t.Helper()
	var index struct {
		Manifests []struct{ Digest string } `json:"manifests"`
	}
	var manifest struct {
		Config struct{ Digest string }   `json:"config"`
		Layers []struct{ Digest string } `json:"layers"`
	}
	_ = json.Unmarshal(layoutFile(t, tarball, "index.json"), &index)
	if len(index.Manifests) != 1 {
		return nil
	}
	_ = json.Unmarshal(layoutFile(t, tarball, blobName(index.Manifests[0].Digest)), &manifest)
	out := []string{"config " + short(manifest.Config.Digest)}
	for _, l := range manifest.Layers {
		out = append(out, short(l.Digest))
	}
	return out
}

func short(d string) string {
	return strings.TrimPrefix(d, "sha256:")[:min(12, len(strings.TrimPrefix(d, "sha256:")))]
}

// imageFiles reads the named files out of the layers of the one image in
// an OCI layout tarball (a later layer's copy winning), and lists every
// path in them.
func imageFiles(t testing.TB, tarball string, names ...string) (map[string][]byte, map[string]bool) {
	t.Helper()
	var index struct {
		Manifests []struct{ Digest string } `json:"manifests"`
	}
	if idx := layoutFile(t, tarball, "index.json"); json.Unmarshal(idx, &index) != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %s", idx)
	}
	var manifest struct {
		Layers []struct{ Digest string } `json:"layers"`
	}
	if err := json.Unmarshal(layoutFile(t, tarball, blobName(index.Manifests[0].Digest)), &manifest); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	got := map[string][]byte{}
	all := map[string]bool{}
	for _, l := range manifest.Layers {
		zr := layerReader(t, tarball, l.Digest)
		tr := tar.NewReader(zr)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			all[strings.TrimSuffix(h.Name, "/")] = true
			if want[h.Name] {
				b, err := io.ReadAll(tr)
				if err != nil {
					t.Fatal(err)
				}
				got[h.Name] = b
			}
		}
		if err := zr.Close(); err != nil {
			t.Fatalf("layer %s: %v", short(l.Digest), err)
		}
	}
	return got, all
}

// layerReader reads a layer of an OCI layout tarball, decompressed, from
// the system's tar and gzip: compress/flate built with the race detector
// takes about a minute for the node image's layers, and even copying the
// compressed blob through this process costs seconds of the race
// detector's bookkeeping.
func layerReader(t testing.TB, tarball, digest string) io.ReadCloser {
	t.Helper()
	cmd := exec.Command("bash", "-o", "pipefail", "-c", `tar -xOf "$1" "$2" | gzip -dc`, "layer", tarball, blobName(digest))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("tar | gzip: %v", err)
	}
	// A test that fails mid-layer leaves no tar or gzip blocked on a pipe.
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		}
	})
	return &layerStream{ReadCloser: out, cmd: cmd, stderr: &stderr}
}

type layerStream struct {
	io.ReadCloser
	cmd    *exec.Cmd
	stderr *bytes.Buffer
}

// Close reads what the tar reader left (the end-of-archive padding), so
// that gzip never blocks on a full pipe, and reports gzip's own failure.
func (g *layerStream) Close() error {
	_, _ = io.Copy(io.Discard, g.ReadCloser)
	if err := g.cmd.Wait(); err != nil {
		return fmt.Errorf("tar | gzip -dc: %v: %s", err, g.stderr.String())
	}
	return nil
}

// Every Debian package in the node image is recorded with its version, in
// packages.tsv and in dpkg's status database, and they are the lock file's.
func TestNodeImageRecordsEveryDebianPackage(t *testing.T) {
	dir, _ := buildImages(t)
	files, all := imageFiles(t, filepath.Join(dir, "kairon-node.oci.tar"),
		"usr/share/kairon/packages.tsv", "var/lib/dpkg/status")
	tsv := map[string]string{}
	for i, l := range strings.Split(strings.TrimSpace(string(files["usr/share/kairon/packages.tsv"])), "\n") {
		f := strings.Split(l, "\t")
		if i == 0 {
			if l != "package\tversion\tarchitecture\tsource" {
				t.Fatalf("packages.tsv header %q", l)
			}
			continue
		}
		if len(f) != 4 || f[0] == "" || f[1] == "" {
			t.Fatalf("packages.tsv line %q", l)
		}
		tsv[f[0]] = f[1]
	}
	status := map[string]string{}
	for _, para := range strings.Split(string(files["var/lib/dpkg/status"]), "\n\n") {
		var name, ver, st string
		for _, l := range strings.Split(para, "\n") {
			if v, ok := strings.CutPrefix(l, "Package: "); ok {
				name = v
			}
			if v, ok := strings.CutPrefix(l, "Version: "); ok {
				ver = v
			}
			if v, ok := strings.CutPrefix(l, "Status: "); ok {
				st = v
			}
		}
		if name != "" {
			if st != "install ok installed" {
				t.Errorf("dpkg status of %s: %q", name, st)
			}
			status[name] = ver
		}
	}
	lockFile, err := os.Open(filepath.Join(repoRoot(t), "hack/images/debian.lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer lockFile.Close()
	lock := map[string]string{}
	sc := bufio.NewScanner(lockFile)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			name, ver, _ := strings.Cut(l, "=")
			lock[name] = ver
		}
	}
	if len(lock) < 10 {
		t.Fatalf("the lock file lists %d packages", len(lock))
	}
	for name, ver := range lock {
		if tsv[name] != ver || status[name] != ver {
			t.Errorf("%s %s (lock file): packages.tsv says %q, dpkg status %q", name, ver, tsv[name], status[name])
		}
	}
	if len(tsv) != len(lock) || len(status) != len(lock) {
		t.Errorf("%d packages in the lock file, %d in packages.tsv, %d in dpkg status", len(lock), len(tsv), len(status))
	}
	for _, p := range []string{"qemu-system-x86", "iproute2", "nftables", "dash", "libc6"} {
		if tsv[p] == "" {
			t.Errorf("no %s in the node image", p)
		}
	}
	for _, f := range []string{"usr/bin/qemu-system-x86_64", "usr/sbin/nft", "usr/bin/ip", "usr/bin/sh", "bin", "usr/lib/kairon/kairon-node",
		"usr/lib/kairon/guest/default/vmlinux", "usr/lib/kairon/guest/default/initramfs.cpio.gz"} {
		if !all[f] {
			t.Errorf("the node image has no /%s", f)
		}
	}
}

// podman runs podman and returns its standard output, failing the test on
// an error.
func podman(t testing.TB, args ...string) string {
	t.Helper()
	out, err := podmanErr(args...)
	if err != nil {
		t.Fatalf("podman %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func podmanErr(args ...string) (string, error) {
	var stderr bytes.Buffer
	cmd := exec.Command("podman", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%v: %s", err, stderr.String())
	}
	return string(out), nil
}

var podmanReady struct {
	once sync.Once
	err  error
}

// preparePodman makes this host able to run containers: crun refuses a
// cgroup v1 host whose v2 hierarchy still holds controllers (the hybrid
// layout of this project's machines, where v2 keeps hugetlb), so each such
// controller gets its v1 hierarchy, which takes it off v2. That stays so
// until the host reboots: the kernel keeps a v1 hierarchy that had cgroups
// even after it is unmounted (tried: the controller did not come back to
// v2), so the mount is left for the next run rather than hidden.
func preparePodman(t testing.TB) {
	t.Helper()
	podmanReady.once.Do(func() {
		var st syscall.Statfs_t
		if err := syscall.Statfs("/sys/fs/cgroup", &st); err != nil || st.Type == 0x63677270 {
			return // pure v2, or nothing to do
		}
		b, err := os.ReadFile("/sys/fs/cgroup/unified/cgroup.controllers")
		if err != nil {
			return
		}
		for _, c := range strings.Fields(string(b)) {
			dir := "/sys/fs/cgroup/" + c
			if err := os.MkdirAll(dir, 0o755); err != nil {
				podmanReady.err = err
				return
			}
			if out, err := exec.Command("mount", "-t", "cgroup", "-o", c, "cgroup", dir).CombinedOutput(); err != nil {
				podmanReady.err = fmt.Errorf("mounting the v1 %s hierarchy (crun needs v2 without controllers on a v1 host): %v: %s", c, err, out)
				return
			}
		}
	})
	if podmanReady.err != nil {
		t.Fatal(podmanReady.err)
	}
}

// ulimits are podman's resource limits for a container: its defaults
// raise limits above this process's own, which needs CAP_SYS_RESOURCE,
// not every host's root has it.
func ulimits() []string {
	var nofile, nproc syscall.Rlimit
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &nofile)
	_ = syscall.Getrlimit(7 /* RLIMIT_NPROC */, &nproc)
	n := min(nofile.Max, 1<<20)
	p := min(nproc.Max, 32768)
	return []string{"--ulimit", fmt.Sprintf("nofile=%d:%d", n, n), "--ulimit", fmt.Sprintf("nproc=%d:%d", p, p)}
}

// loadImage loads an image tarball into podman's store and removes it when
// the test ends.
func loadImage(t testing.TB, dir, name string) string {
	t.Helper()
	preparePodman(t)
	out := podman(t, "load", "-q", "-i", filepath.Join(dir, name+".oci.tar"))
	m := regexp.MustCompile(`Loaded image(?:\(s\))?: (\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("podman load %s: %q", name, out)
	}
	// After the containers made from it (cleanups run last first).
	t.Cleanup(func() { _, _ = podmanErr("rmi", "--ignore", m[1]) })
	return m[1]
}

// container runs one podman container in the background, removed when the
// test ends (its log shown if the test failed).
type container struct {
	name string
}

func runContainer(t testing.TB, name string, args ...string) *container {
	t.Helper()
	full := append([]string{"run", "-d", "--name", name}, ulimits()...)
	full = append(full, args...)
	podman(t, full...)
	c := &container{name: name}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := exec.Command("podman", "logs", "--tail", "60", name).CombinedOutput()
			t.Logf("podman logs %s:\n%s", name, out)
		}
		_, _ = podmanErr("rm", "-f", "-t", "5", name)
	})
	return c
}

// pid is the host PID of the container's first process.
func (c *container) pid(t testing.TB) int {
	t.Helper()
	s := strings.TrimSpace(podman(t, "inspect", "-f", "{{.State.Pid}}", c.name))
	pid, err := strconv.Atoi(s)
	if err != nil || pid == 0 {
		t.Fatalf("podman inspect %s: pid %q", c.name, s)
	}
	return pid
}

func (c *container) id(t testing.TB) string {
	t.Helper()
	return strings.TrimSpace(podman(t, "inspect", "-f", "{{.Id}}", c.name))
}

// readableKubeconfig copies the admin kubeconfig to a file the container's
// user may read.
func readableKubeconfig(t testing.TB, env *testenv.Env) string {
	t.Helper()
	b, err := os.ReadFile(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	// t.TempDir's directories are 0700 for root only.
	for d := filepath.Dir(p); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		_ = os.Chmod(d, 0o755)
	}
	return p
}

func suffix() string {
	return strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
}

// startControllerContainer runs kairon-controller from its image against
// the test API server, on the host's network.
func startControllerContainer(t testing.TB, env *testenv.Env, ref string) *container {
	t.Helper()
	kc := readableKubeconfig(t, env)
	return runContainer(t, "kairon-test-controller-"+suffix(), "--network", "host",
		"-v", kc+":/etc/kairon/kubeconfig:ro", ref,
		"-kubeconfig", "/etc/kairon/kubeconfig", "-interval", "2s",
		"-metrics-bind-address", "0", "-health-probe-bind-address", "0")
}

// procStatusIDs reads the Uid and Gid lines of /proc/<pid>/status.
func procStatusIDs(t testing.TB, pid int) (uid, gid string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			uid = strings.Join(strings.Fields(v), " ")
		}
		if v, ok := strings.CutPrefix(l, "Gid:"); ok {
			gid = strings.Join(strings.Fields(v), " ")
		}
	}
	return uid, gid
}

// The controller image runs kairon-controller as the non-root user 65532
// and it reconciles a MachineSet against a real API server.
func TestControllerImageRunsAsNonRootAndReconcilesAMachineSet(t *testing.T) {
	dir, _ := buildImages(t)
	env := testenv.Get(t)
	ref := loadImage(t, dir, "kairon-controller")
	if user := strings.TrimSpace(podman(t, "image", "inspect", "-f", "{{.Config.User}}", ref)); user != "65532:65532" {
		t.Errorf("the controller image's user is %q, want 65532:65532", user)
	}
	for _, ui := range []string{"kairon-ui"} {
		r := loadImage(t, dir, ui)
		if user := strings.TrimSpace(podman(t, "image", "inspect", "-f", "{{.Config.User}}", r)); user != "65532:65532" {
			t.Errorf("the %s image's user is %q, want 65532:65532", ui, user)
		}
	}

	c := startControllerContainer(t, env, ref)
	if uid, gid := procStatusIDs(t, c.pid(t)); uid != "65532 65532 65532 65532" || gid != "65532 65532 65532 65532" {
		t.Errorf("kairon-controller in its container runs as uid %q gid %q, want 65532 throughout", uid, gid)
	}

	ns := env.Namespace(t)
	ms := &kaironv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: kaironv1.MachineSetSpec{
			Replicas: ptr(int32(2)),
			Selector: kaironv1.MachineSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: kaironv1.MachineTemplateSpec{
				Metadata: kaironv1.MachineTemplateMeta{Labels: map[string]string{"app": "web"}},
				Spec:     kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("256Mi")},
			},
		},
	}
	if err := env.Client.Create(context.Background(), ms); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Minute, "the MachineSet's two Machines and its status", func() (bool, string) {
		var list kaironv1.MachineList
		if err := env.Client.List(context.Background(), &list, client.InNamespace(ns), client.MatchingLabels{"app": "web"}); err != nil {
			return false, err.Error()
		}
		owned := 0
		for _, m := range list.Items {
			if ref := metav1.GetControllerOf(&m); ref != nil && ref.Kind == "MachineSet" && ref.Name == "web" {
				owned++
			}
		}
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(ms), ms); err != nil {
			return false, err.Error()
		}
		return owned == 2 && ms.Status.Replicas == 2, fmt.Sprintf("%d Machines owned by the set, status.replicas %d", owned, ms.Status.Replicas)
	})
}

func ptr[T any](v T) *T { return &v }

// qemuPID reads the PID of the one VM under the agent's state directory.
func qemuPID(t testing.TB, stateDir string) int {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(stateDir, "instances", "*", "qemu.pid"))
	if len(files) != 1 {
		t.Fatalf("want one VM's qemu.pid under %s, found %v", stateDir, files)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// startTime is a process's start time (field 22 of /proc/<pid>/stat), so
// that a PID is known to be the same process and not a reused number.
func startTime(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+2:])
	if len(f) < 20 {
		return "", fmt.Errorf("short /proc/%d/stat", pid)
	}
	return f[19], nil
}

func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "gone"
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return strings.Fields(s[i+2:])[0]
}

// The node image runs kairon-node privileged, on the host's network and
// PID namespace (the chart's DaemonSet); a Machine placed on it boots and
// answers; `podman restart` of the agent's container leaves the guest's
// QEMU running on the same PID, outside every cgroup of the container, and
// the restarted agent adopts it: the guest still answers, and deleting the
// Machine stops it.
func TestNodeImageRunsVMsThatOutliveItsContainer(t *testing.T) {
	dir, refs := buildImages(t)
	env := testenv.Get(t)
	ctrlRef := loadImage(t, dir, "kairon-controller")
	nodeRef := loadImage(t, dir, "kairon-node")
	if nodeRef != refs["kairon-node"] {
		t.Fatalf("podman loaded %q, the build named it %q", nodeRef, refs["kairon-node"])
	}
	startControllerContainer(t, env, ctrlRef)

	ns := env.Namespace(t)
	netNS := netlab.Namespace(t, "kairon-img")
	state := t.TempDir()
	nodeName := "img-" + suffix()
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	})
	kc := readableKubeconfig(t, env)
	// The VM uid registry is the host's, as the chart mounts it.
	if err := os.MkdirAll("/run/kairon", 0o755); err != nil {
		t.Fatal(err)
	}
	agent := runContainer(t, "kairon-test-node-"+suffix(),
		"--privileged", "--network", "host", "--pid", "host",
		"-v", kc+":/etc/kairon/kubeconfig:ro",
		"-v", state+":"+state,
		"-v", "/run/netns:/run/netns",
		"-v", "/run/kairon:/run/kairon",
		nodeRef,
		"--kubeconfig", "/etc/kairon/kubeconfig", "--node-name", nodeName, "--register",
		"--state-dir", state, "--netns", netNS, "--network-cidr", "10.88.46.0/24",
		"--cpu", "2", "--memory", "2Gi", "--listen", "127.0.0.1:0", "--interval", "2s",
		"--vm-scope", "host")
	t.Cleanup(func() { killVMs(state) })
	agentPID := agent.pid(t)
	ctrID := agent.id(t)

	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hello"},
		Spec: kaironv1.MachineSpec{NodeName: nodeName}}
	if err := env.Client.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(m)
	waitRunning(t, env, key, m, agent)
	address := m.Status.Addresses[0].Address
	answers(t, netNS, address)

	pid := qemuPID(t, state)
	born, err := startTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(cg), ctrID) {
		t.Fatalf("QEMU (PID %d) is in a cgroup of the agent's container %s:\n%s", pid, ctrID[:12], cg)
	}
	if !strings.Contains(string(cg), "/kairon/vm-") {
		t.Errorf("QEMU (PID %d) is not in a per-VM cgroup under kairon/:\n%s", pid, cg)
	}

	podman(t, "restart", "-t", "30", agent.name)
	if p := agent.pid(t); p == agentPID {
		t.Fatalf("the agent's PID is still %d after podman restart", p)
	}
	if st, err := startTime(pid); err != nil || st != born {
		t.Fatalf("QEMU PID %d did not survive the restart of the agent's container (start time %q, was %q): %v", pid, st, born, err)
	}
	if s := procState(pid); s == "T" || s == "t" {
		t.Fatalf("QEMU PID %d is stopped (state %s) after the restart", pid, s)
	}
	answers(t, netNS, address)

	// The new agent owns the VM: it keeps the Machine Running and, told to
	// delete it, stops the very QEMU it adopted.
	if err := env.Client.Get(context.Background(), key, m); err != nil || m.Status.Phase != kaironv1.MachineRunning {
		t.Fatalf("after the restart the Machine is %q (%v)", m.Status.Phase, err)
	}
	if err := env.Client.Delete(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Minute, "the adopted VM stopped and the Machine gone", func() (bool, string) {
		err := env.Client.Get(context.Background(), key, &kaironv1.Machine{})
		_, serr := startTime(pid)
		return apierrors.IsNotFound(err) && serr != nil, fmt.Sprintf("Machine: %v; QEMU PID %d alive: %v", err, pid, serr == nil)
	})
}

func waitRunning(t testing.TB, env *testenv.Env, key client.ObjectKey, m *kaironv1.Machine, agent *container) {
	t.Helper()
	testenv.Eventually(t, 4*time.Minute, key.String()+" Running", func() (bool, string) {
		if st, _ := podmanErr("inspect", "-f", "{{.State.Status}}", agent.name); strings.TrimSpace(st) != "running" {
			t.Fatalf("the agent's container is %q", strings.TrimSpace(st))
		}
		if err := env.Client.Get(context.Background(), key, m); err != nil {
			return false, err.Error()
		}
		return m.Status.Phase == kaironv1.MachineRunning && len(m.Status.Addresses) > 0, fmt.Sprintf("%s: %s", m.Status.Phase, m.Status.Message)
	})
}

func answers(t testing.TB, netNS, address string) {
	t.Helper()
	testenv.Eventually(t, time.Minute, "the guest answering on "+address+":8080", func() (bool, string) {
		page, err := netlab.Get(netNS, "http://"+address+":8080/")
		return err == nil && strings.Contains(page, "kairon guest"), fmt.Sprintf("%v %q", err, page)
	})
}

// killVMs kills whatever QEMU still runs for the state directory (a failed
// test's VM outlives its container by design).
func killVMs(state string) {
	files, _ := filepath.Glob(filepath.Join(state, "instances", "*", "qemu.pid"))
	sort.Strings(files)
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
			if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && bytes.Contains(cmdline, []byte("qemu-system")) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}
