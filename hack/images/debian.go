package main

import (
	"archive/tar"
	"bytes"
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
)

// The node image's Debian part: the packages of nodeRoots and everything
// they depend on (no recommends), at the versions of the lock file, fetched
// from the host's Debian archive with apt-get download (which checks them
// against the archive's signed Release file) and unpacked with dpkg-deb,
// without running maintainer scripts.

// nodeRoots are the packages the node agent runs: QEMU; ip, bridge and
// nft; and sh (dash), through which it writes sysctls in a network
// namespace (ip netns exec NS sh -c ...).
var nodeRoots = []string{"qemu-system-x86", "iproute2", "nftables", "dash"}

type debPkg struct {
	name, version string
}

func (p debPkg) String() string { return p.name + "=" + p.version }

var instLine = regexp.MustCompile(`^Inst (\S+) \((\S+) `)

// resolveClosure asks apt for the packages an empty system needs to install
// roots without recommends, at the archive's current candidate versions.
func resolveClosure(roots []string) ([]debPkg, error) {
	empty, err := os.CreateTemp("", "kairon-images-status-")
	if err != nil {
		return nil, err
	}
	empty.Close()
	defer os.Remove(empty.Name())
	args := append([]string{"install", "-s", "-qq", "--no-install-recommends",
		"-o", "Dir::State::status=" + empty.Name(), "-o", "Debug::NoLocking=1"}, roots...)
	out, err := exec.Command("apt-get", args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("apt-get %s: %w: %s", strings.Join(args, " "), err, out)
	}
	var pkgs []debPkg
	for _, line := range strings.Split(string(out), "\n") {
		if m := instLine.FindStringSubmatch(line); m != nil {
			pkgs = append(pkgs, debPkg{m[1], m[2]})
		}
	}
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("apt-get resolved no packages for %v (no package lists? run apt-get update): %s", roots, out)
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].name < pkgs[j].name })
	return pkgs, nil
}

const lockHeader = `# The Debian packages of the kairon-node image: the closure of %s
# without recommends, one package=version a line. hack/images builds from
# exactly these; regenerate with: go run ./hack/images --update-lock
`

func writeLock(file string, pkgs []debPkg) error {
	var b strings.Builder
	fmt.Fprintf(&b, lockHeader, strings.Join(nodeRoots, ", "))
	for _, p := range pkgs {
		b.WriteString(p.String() + "\n")
	}
	return os.WriteFile(file, []byte(b.String()), 0o644)
}

func readLock(file string) ([]debPkg, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var pkgs []debPkg
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, ver, ok := strings.Cut(line, "=")
		if !ok || name == "" || ver == "" {
			return nil, fmt.Errorf("%s:%d: %q is not package=version", file, i+1, line)
		}
		pkgs = append(pkgs, debPkg{name, ver})
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].name < pkgs[j].name })
	return pkgs, nil
}

// debFile finds the downloaded .deb of p in dir ("" if none): apt-get
// download names it name_version_arch.deb with the epoch's colon as %3a.
func debFile(dir string, p debPkg) string {
	matches, _ := filepath.Glob(filepath.Join(dir, p.name+"_"+strings.ReplaceAll(p.version, ":", "%3a")+"_*.deb"))
	if len(matches) == 0 {
		return ""
	}
	return matches[0]
}

// fetchDebs downloads the packages missing from cache and returns every
// package's .deb.
func fetchDebs(cache string, pkgs []debPkg) (map[string]string, error) {
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, err
	}
	var missing []string
	for _, p := range pkgs {
		if debFile(cache, p) == "" {
			missing = append(missing, p.String())
		}
	}
	if len(missing) > 0 {
		fmt.Fprintf(os.Stderr, "kairon-images: downloading %d Debian packages into %s\n", len(missing), cache)
		cmd := exec.Command("apt-get", append([]string{"download", "-qq"}, missing...)...)
		cmd.Dir = cache
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("apt-get download: %w: %s\n(a version of the lock file no longer in the archive? regenerate it with --update-lock)", err, out)
		}
	}
	debs := map[string]string{}
	for _, p := range pkgs {
		f := debFile(cache, p)
		if f == "" {
			return nil, fmt.Errorf("apt-get download left no .deb for %s in %s", p, cache)
		}
		debs[p.name] = f
	}
	return debs, nil
}

// controlFields returns a package's control paragraph (dpkg-deb -f).
func controlFields(deb string) ([]byte, error) {
	out, err := exec.Command("dpkg-deb", "-f", deb).Output()
	if err != nil {
		return nil, fmt.Errorf("dpkg-deb -f %s: %w", deb, err)
	}
	return bytes.TrimRight(out, "\n"), nil
}

func field(control []byte, name string) string {
	for _, line := range strings.Split(string(control), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// mergedUsr maps a path of a package to where it lives on a merged-/usr
// system, as Debian 12's debootstrap lays one out: /bin, /sbin and /lib*
// are symlinks into /usr.
func mergedUsr(p string) string {
	first, _, _ := strings.Cut(p, "/")
	switch first {
	case "bin", "sbin", "lib", "lib32", "lib64", "libx32":
		return "usr/" + p
	}
	return p
}

var mergedUsrLinks = []string{"bin", "sbin", "lib", "lib64"}

// unpackDebs adds the packages' files to t, their regular files' content
// copied under staging; the packages in name order, a later one's file
// replacing an earlier one's. It also writes the dpkg status database and
// /usr/share/kairon/packages.tsv, so that scanners and people see what the
// image holds.
func unpackDebs(t tree, staging string, pkgs []debPkg, debs map[string]string) error {
	for _, l := range mergedUsrLinks {
		t.symlink(l, "usr/"+l)
		t.dir("usr/"+l, 0o755, 0, 0)
	}
	var status bytes.Buffer
	tsv := &strings.Builder{}
	tsv.WriteString("package\tversion\tarchitecture\tsource\n")
	n := 0
	for _, p := range pkgs {
		deb := debs[p.name]
		control, err := controlFields(deb)
		if err != nil {
			return err
		}
		if v := field(control, "Version"); v != p.version {
			return fmt.Errorf("%s: version %q, the lock file says %q", deb, v, p.version)
		}
		src := field(control, "Source")
		if src == "" {
			src = p.name
		}
		fmt.Fprintf(tsv, "%s\t%s\t%s\t%s\n", p.name, p.version, field(control, "Architecture"), src)
		// The status paragraph: the control fields with Status after Package.
		lines := strings.Split(string(control), "\n")
		status.WriteString(lines[0] + "\nStatus: install ok installed\n")
		for _, l := range lines[1:] {
			status.WriteString(l + "\n")
		}
		status.WriteString("\n")

		cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		err = unpackTar(t, staging, out, &n)
		if werr := cmd.Wait(); err == nil && werr != nil {
			err = werr
		}
		if err != nil {
			return fmt.Errorf("unpacking %s: %w", deb, err)
		}
	}
	t.file("var/lib/dpkg/status", status.Bytes(), 0o644)
	t.file("usr/share/kairon/packages.tsv", []byte(tsv.String()), 0o644)
	return nil
}

func unpackTar(t tree, staging string, r io.Reader, n *int) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := mergedUsr(cleanPath(h.Name))
		if p == "" {
			continue
		}
		mode := h.Mode & 0o7777
		switch h.Typeflag {
		case tar.TypeDir:
			if e, ok := t[p]; ok && e.typ == tar.TypeSymlink {
				continue // a merged-/usr link stays a link
			}
			t.dir(p, mode, h.Uid, h.Gid)
		case tar.TypeSymlink:
			t.symlink(p, h.Linkname)
		case tar.TypeLink:
			// A copy rather than a hard link: the layer's sorted order may
			// put the link before its target.
			target, ok := t[mergedUsr(cleanPath(h.Linkname))]
			if !ok || target.typ != tar.TypeReg {
				return fmt.Errorf("%s: hard link to %s, which is not a file before it", h.Name, h.Linkname)
			}
			t[p] = &entry{typ: tar.TypeReg, mode: mode, uid: h.Uid, gid: h.Gid, src: target.src}
		case tar.TypeReg:
			*n++
			dst := filepath.Join(staging, strconv.Itoa(*n))
			f, err := os.Create(dst)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			t[p] = &entry{typ: tar.TypeReg, mode: mode, uid: h.Uid, gid: h.Gid, src: dst}
		default:
			// Device nodes and fifos: none in these packages, and a
			// container runtime provides /dev.
		}
	}
}

// hostPackageVersion is the version of an installed Debian package of the
// build host (dpkg-query), for files the image takes from the host.
func hostPackageVersion(name string) (string, error) {
	out, err := exec.Command("dpkg-query", "-W", "-f=${Version}", name).Output()
	if err != nil || len(out) == 0 {
		return "", fmt.Errorf("the build host's Debian package %s is not installed (apt-get install %s)", name, name)
	}
	return string(out), nil
}
