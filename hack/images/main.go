package main

import (
	"archive/tar"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/zyvor/kairon/internal/debimage"
)

// DefaultRegistry is where the chart's default image references point.
const DefaultRegistry = "ghcr.io/zyvor"

// Names of the images, as the chart's values.yaml refers to them.
var imageNames = []string{"kairon-controller", "kairon-ui", "kairon-node"}

// The non-root user of the controller and UI images (the chart's
// runAsUser).
const (
	nonRootUID  = 65532
	nonRootName = "nonroot"
)

const binDir = "usr/local/bin"

// nodeLibDir holds kairon-node and, beside it, the guest images where
// kairon-node looks by default (guest/ next to its executable).
const nodeLibDir = "usr/lib/kairon"

type options struct {
	out, version, registry, guestDir, debCache, lock string
	revision                                         string
	updateLock                                       bool
	only                                             string
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kairon-images:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) > 0 && args[0] == "python" {
		return runPython(context.Background(), args[1:], os.Stdout, os.Stderr)
	}
	push := len(args) > 0 && args[0] == "push"
	if push || len(args) > 0 && args[0] == "build" {
		args = args[1:]
	}
	var o options
	fs := flag.NewFlagSet("images", flag.ContinueOnError)
	fs.StringVar(&o.out, "out", "bin/images", "directory of the OCI layout tarballs (<name>.oci.tar)")
	fs.StringVar(&o.version, "version", "", "the images' tag; empty: the chart's appVersion (charts/kairon/Chart.yaml)")
	fs.StringVar(&o.registry, "registry", DefaultRegistry, "registry and path the images are named under (<registry>/kairon-controller:<version>); push pushes there")
	fs.StringVar(&o.guestDir, "guest-dir", "bin/guest", "the guest images for the node image (make guest)")
	fs.StringVar(&o.debCache, "deb-cache", "bin/images/debs", "where downloaded Debian packages are kept")
	fs.StringVar(&o.lock, "lock", "hack/images/debian.lock", "the node image's Debian packages and versions")
	fs.BoolVar(&o.updateLock, "update-lock", false, "resolve the node image's packages again at the archive's current versions and rewrite --lock")
	fs.StringVar(&o.only, "only", "", "comma-separated image names to build (default: all)")
	fs.StringVar(&o.revision, "revision", "", "the commit recorded in the label org.opencontainers.image.revision; empty: git rev-parse HEAD")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.registry == "" {
		return errors.New("--registry: must not be empty")
	}
	if o.version == "" {
		v, err := chartAppVersion("charts/kairon/Chart.yaml")
		if err != nil {
			return fmt.Errorf("--version not given: %w", err)
		}
		o.version = v
	}
	if push {
		return pushAll(o)
	}
	return buildAll(o)
}

var appVersionLine = regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)"?\s*$`)

// chartAppVersion is the chart's appVersion, which its default image tag is.
func chartAppVersion(chart string) (string, error) {
	b, err := os.ReadFile(chart)
	if err != nil {
		return "", err
	}
	m := appVersionLine.FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("%s has no appVersion", chart)
	}
	return string(m[1]), nil
}

func ref(o options, image string) string { return o.registry + "/" + image + ":" + o.version }

func tarballPath(o options, image string) string {
	return filepath.Join(o.out, image+".oci.tar")
}

// sourceDate is SOURCE_DATE_EPOCH, or the last commit's time.
func sourceDate() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		out, err := exec.Command("git", "log", "-1", "--format=%ct").Output()
		if err != nil {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH unset and git log failed: %w", err)
		}
		s = strings.TrimSpace(string(out))
	}
	sec, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
	}
	return time.Unix(sec, 0).UTC(), nil
}

func gitRevision() string {
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

func buildAll(o options) error {
	want := map[string]bool{}
	for _, n := range imageNames {
		want[n] = o.only == ""
	}
	if o.only != "" {
		for _, n := range strings.Split(o.only, ",") {
			if _, ok := want[n]; !ok {
				return fmt.Errorf("--only %q: unknown image (known: %s)", n, strings.Join(imageNames, ", "))
			}
			want[n] = true
		}
	}
	date, err := sourceDate()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp(o.out, ".work-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if o.revision == "" {
		o.revision = gitRevision()
	}
	b := &builder{o: o, date: date, work: work, revision: o.revision}
	for _, n := range imageNames {
		if !want[n] {
			continue
		}
		var img v1.Image
		switch n {
		case "kairon-node":
			img, err = b.nodeImage()
		default:
			img, err = b.staticImage(n)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		if err := b.writeLayoutTar(img, n); err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		d, _ := img.Digest()
		fmt.Printf("%s\t%s\t%s\n", ref(o, n), d, tarballPath(o, n))
	}
	return nil
}

type builder struct {
	o        options
	date     time.Time
	work     string
	revision string
	images   int
}

// goBinary builds ./cmd/<name> statically for linux/amd64.
func (b *builder) goBinary(name string) (string, error) {
	out := filepath.Join(b.work, "bin", name)
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -buildid=", "-o", out, "./cmd/"+name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/%s: %w", name, err)
	}
	return out, nil
}

type layerSpec struct {
	tree      debimage.Tree
	createdBy string
}

// image puts layers and cfg together as an OCI image dated b.date, with
// the labels every Kairon image carries.
func (b *builder) image(imageName string, layers []layerSpec, cfg v1.Config) (v1.Image, error) {
	b.images++
	work := filepath.Join(b.work, fmt.Sprintf("image-%d", b.images))
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	var ls []debimage.Layer
	for _, l := range layers {
		ls = append(ls, debimage.Layer{Tree: l.tree, CreatedBy: l.createdBy})
	}
	if cfg.Labels == nil {
		cfg.Labels = map[string]string{}
	}
	cfg.Labels["org.opencontainers.image.title"] = imageName
	cfg.Labels["org.opencontainers.image.version"] = b.o.version
	cfg.Labels["org.opencontainers.image.created"] = b.date.Format(time.RFC3339)
	cfg.Labels["org.opencontainers.image.source"] = "https://github.com/zyvor/kairon"
	if b.revision != "" {
		cfg.Labels["org.opencontainers.image.revision"] = b.revision
	}
	return debimage.Assemble(work, b.date, "hack/images", ls, cfg)
}

const pathEnv = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// staticImage is kairon-controller or kairon-ui: the static binary, the
// build host's CA certificates (Debian's ca-certificates, its version
// recorded), and a non-root user it runs as.
func (b *builder) staticImage(name string) (v1.Image, error) {
	caVersion, err := debimage.HostPackageVersion("ca-certificates")
	if err != nil {
		return nil, err
	}
	base := debimage.Tree{}
	base.File("etc/passwd", []byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\n%s:x:%d:%d:%s:/home/%s:/sbin/nologin\n",
		nonRootName, nonRootUID, nonRootUID, nonRootName, nonRootName)), 0o644)
	base.File("etc/group", []byte(fmt.Sprintf("root:x:0:\n%s:x:%d:\n", nonRootName, nonRootUID)), 0o644)
	base.FileFrom("etc/ssl/certs/ca-certificates.crt", "/etc/ssl/certs/ca-certificates.crt", 0o644)
	base.Dir("home/"+nonRootName, 0o700, nonRootUID, nonRootUID)
	base.Dir("root", 0o700, 0, 0)
	base.Dir("tmp", 0o1777, 0, 0)
	base.File("usr/share/kairon/packages.tsv", []byte("package\tversion\tarchitecture\tsource\n"+
		"ca-certificates\t"+caVersion+"\tall\tca-certificates\n"), 0o644)

	bin, err := b.goBinary(name)
	if err != nil {
		return nil, err
	}
	app := debimage.Tree{}
	app.FileFrom(binDir+"/"+name, bin, 0o755)
	return b.image(name, []layerSpec{
		{base, "users, CA certificates (ca-certificates " + caVersion + ")"},
		{app, "/" + binDir + "/" + name},
	}, v1.Config{
		User:       fmt.Sprintf("%d:%d", nonRootUID, nonRootUID),
		Entrypoint: []string{"/" + binDir + "/" + name},
		Env:        []string{pathEnv, "HOME=/home/" + nonRootName},
		WorkingDir: "/home/" + nonRootName,
	})
}

// nodeImage is kairon-node with QEMU, iproute2 and nftables from Debian
// packages, and the guest images.
func (b *builder) nodeImage() (v1.Image, error) {
	pkgs, err := nodePackages(b.o)
	if err != nil {
		return nil, err
	}
	debs, err := debimage.Fetch(b.o.debCache, pkgs, os.Stderr)
	if err != nil {
		return nil, err
	}
	staging := filepath.Join(b.work, "debs")
	if err := os.MkdirAll(staging, 0o755); err != nil {
		return nil, err
	}
	base := debimage.Tree{}
	if err := debimage.Unpack(base, staging, pkgs, debs, debimage.UnpackOptions{}); err != nil {
		return nil, err
	}
	base.File("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
	base.File("etc/group", []byte("root:x:0:\nkvm:x:994:\n"), 0o644)
	base.Dir("root", 0o700, 0, 0)
	base.Dir("tmp", 0o1777, 0, 0)
	base.Dir("var/lib/kairon-node", 0o755, 0, 0)
	// What base-files would lay out: /var/run is /run (ip netns keeps its
	// namespaces in /var/run/netns).
	base.Dir("run", 0o755, 0, 0)
	base.Symlink("var/run", "/run")

	guest := debimage.Tree{}
	if err := addDir(guest, b.o.guestDir, nodeLibDir+"/guest"); err != nil {
		return nil, fmt.Errorf("guest images (make guest): %w", err)
	}

	bin, err := b.goBinary("kairon-node")
	if err != nil {
		return nil, err
	}
	app := debimage.Tree{}
	app.FileFrom(nodeLibDir+"/kairon-node", bin, 0o755)
	app.Symlink(binDir+"/kairon-node", "/"+nodeLibDir+"/kairon-node")

	return b.image("kairon-node", []layerSpec{
		{base, fmt.Sprintf("Debian packages %s and their dependencies (/usr/share/kairon/packages.tsv)", strings.Join(nodeRoots, ", "))},
		{guest, "guest images (make guest)"},
		{app, "/" + nodeLibDir + "/kairon-node"},
	}, v1.Config{
		Entrypoint: []string{"/" + nodeLibDir + "/kairon-node"},
		Env:        []string{pathEnv},
	})
}

// addDir adds the regular files and directories under src to t at dst.
func addDir(t debimage.Tree, src, dst string) error {
	return filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case fi.IsDir():
			t.Dir(target, 0o755, 0, 0)
		case fi.Mode().IsRegular():
			t.FileFrom(target, p, 0o644)
		}
		return nil
	})
}

// writeLayoutTar writes img as an OCI image layout, tagged with its
// reference, into a tar file (entries sorted, dated b.date).
func (b *builder) writeLayoutTar(img v1.Image, imageName string) error {
	dir := filepath.Join(b.work, imageName+".layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	r := ref(b.o, imageName)
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		// The OCI annotation holds the full reference, as podman load and
		// skopeo read it; containerd reads its own.
		"org.opencontainers.image.ref.name": r,
		"io.containerd.image.name":          r,
	})); err != nil {
		return err
	}
	t := debimage.Tree{}
	if err := addDir(t, dir, ""); err != nil {
		return err
	}
	delete(t, ".")
	out := tarballPath(b.o, imageName)
	tmp := out + ".tmp"
	if err := t.WriteTar(tmp, b.date); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// readLayoutTar unpacks an OCI layout tarball into dir and returns its one
// image.
func readLayoutTar(file, dir string) (v1.Image, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		p := filepath.Join(dir, debimage.CleanPath(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return nil, err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return nil, err
			}
			w, err := os.Create(p)
			if err != nil {
				return nil, err
			}
			_, err = io.Copy(w, tr)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return nil, err
			}
		}
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Manifests) != 1 {
		return nil, fmt.Errorf("%s: %d images in the layout, want 1", file, len(m.Manifests))
	}
	return idx.Image(m.Manifests[0].Digest)
}

// pushAll pushes every built image to <registry>/<name>:<version>.
func pushAll(o options) error {
	tmp, err := os.MkdirTemp("", "kairon-images-push-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var names []string
	for _, n := range imageNames {
		if _, err := os.Stat(tarballPath(o, n)); err == nil {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("no images in %s: run make images first", o.out)
	}
	sort.Strings(names)
	for _, n := range names {
		img, err := readLayoutTar(tarballPath(o, n), filepath.Join(tmp, n))
		if err != nil {
			return err
		}
		r, err := name.ParseReference(ref(o, n))
		if err != nil {
			return fmt.Errorf("--registry %q: %w", o.registry, err)
		}
		if err := remote.Write(r, img, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return fmt.Errorf("pushing %s: %w", r, err)
		}
		d, _ := img.Digest()
		fmt.Printf("pushed %s@%s\n", r, d)
	}
	return nil
}
