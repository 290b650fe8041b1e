package debimage

import (
	"archive/tar"
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// UnpackOptions tune Unpack.
type UnpackOptions struct {
	// Exclude, if set, leaves out the package paths ("usr/share/man/...",
	// as the package names them) it returns true for, as dpkg's
	// path-exclude does.
	Exclude func(p string) bool
	// Database writes, besides the status file, each package's file list
	// (var/lib/dpkg/info/<package>.list) and its conffiles with their
	// checksums, so that dpkg and apt run in the image later know what is
	// installed and which files belong to what.
	Database bool
}

// Unpack adds the packages' files to t, their regular files' content
// copied under staging; the packages in name order, a later one's file
// replacing an earlier one's. Paths under /bin, /sbin and /lib* land in
// /usr, as on a merged-/usr system. It also writes the dpkg status database
// and /usr/share/kairon/packages.tsv, so that scanners and people see what
// the image holds.
func Unpack(t Tree, staging string, pkgs []Package, debs map[string]string, o UnpackOptions) error {
	for _, l := range mergedUsrLinks {
		t.Symlink(l, "usr/"+l)
		t.Dir("usr/"+l, 0o755, 0, 0)
	}
	var status bytes.Buffer
	interests := triggerInterests{}
	tsv := &strings.Builder{}
	tsv.WriteString("package\tversion\tarchitecture\tsource\n")
	n := 0
	for _, p := range pkgs {
		deb := debs[p.Name]
		control, err := controlFields(deb)
		if err != nil {
			return err
		}
		if v := field(control, "Version"); v != p.Version {
			return fmt.Errorf("%s: version %q, the lock file says %q", deb, v, p.Version)
		}
		if pn := field(control, "Package"); pn != p.Name {
			return fmt.Errorf("%s: package %q, the lock file says %q", deb, pn, p.Name)
		}
		arch := field(control, "Architecture")
		src := field(control, "Source")
		if src == "" {
			src = p.Name
		}
		src, _, _ = strings.Cut(src, " ") // "Source: name (version)"
		fmt.Fprintf(tsv, "%s\t%s\t%s\t%s\n", p.Name, p.Version, arch, src)

		cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		var list []string
		err = unpackTar(t, staging, out, &n, o.Exclude, &list)
		if err != nil {
			// Let dpkg-deb end on the closed pipe rather than block.
			_, _ = io.Copy(io.Discard, out)
		}
		if werr := cmd.Wait(); err == nil && werr != nil {
			err = werr
		}
		if err != nil {
			return fmt.Errorf("unpacking %s: %w", deb, err)
		}

		// The status paragraph: the control fields with Status after Package.
		lines := strings.Split(string(control), "\n")
		status.WriteString(lines[0] + "\nStatus: install ok installed\n")
		for _, l := range lines[1:] {
			status.WriteString(l + "\n")
		}
		if o.Database {
			members, err := controlMembers(deb)
			if err != nil {
				return err
			}
			conffiles, err := conffileSums(t, members["conffiles"].data)
			if err != nil {
				return fmt.Errorf("%s: %w", deb, err)
			}
			if conffiles != "" {
				status.WriteString("Conffiles:\n" + conffiles)
			}
			name := p.Name
			if field(control, "Multi-Arch") == "same" {
				name += ":" + arch
			}
			t.File("var/lib/dpkg/info/"+name+".list", []byte(strings.Join(list, "\n")+"\n"), 0o644)
			// The rest of the control archive (maintainer scripts,
			// md5sums, triggers, ...) is kept as dpkg keeps it, for its
			// later upgrades, removals and checks.
			for m, c := range members {
				if m != "control" {
					t.File("var/lib/dpkg/info/"+name+"."+m, c.data, c.mode)
				}
			}
			interests.add(name, members["triggers"].data)
		}
		status.WriteString("\n")
	}
	t.File("var/lib/dpkg/status", status.Bytes(), 0o644)
	t.File("usr/share/kairon/packages.tsv", []byte(tsv.String()), 0o644)
	if o.Database {
		// What dpkg expects to find in its admin directory.
		for _, d := range []string{"info", "updates", "triggers", "alternatives", "parts"} {
			t.Dir("var/lib/dpkg/"+d, 0o755, 0, 0)
		}
		for _, f := range []string{"diversions", "statoverride", "available", "triggers/Unincorp"} {
			t.File("var/lib/dpkg/"+f, nil, 0o644)
		}
		// Format 1: Multi-Arch: same packages' files are named
		// <package>:<arch>.list.
		t.File("var/lib/dpkg/info/format", []byte("1\n"), 0o644)
		interests.write(t)
	}
	return nil
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

type controlMember struct {
	data []byte
	mode int64
}

// controlMembers reads a package's control archive: control, conffiles,
// md5sums, maintainer scripts, triggers, by name.
func controlMembers(deb string) (map[string]controlMember, error) {
	out, err := exec.Command("dpkg-deb", "--ctrl-tarfile", deb).Output()
	if err != nil {
		return nil, fmt.Errorf("dpkg-deb --ctrl-tarfile %s: %w", deb, err)
	}
	members := map[string]controlMember{}
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return members, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: control archive: %w", deb, err)
		}
		name := CleanPath(h.Name)
		if h.Typeflag != tar.TypeReg || name == "" || strings.Contains(name, "/") {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(tr, 16<<20))
		if err != nil {
			return nil, fmt.Errorf("%s: control archive: %w", deb, err)
		}
		members[name] = controlMember{data: b, mode: h.Mode & 0o777}
	}
}

// conffileSums is the status file's Conffiles value for a package's
// conffiles list: each conffile with the MD5 of the content it ships, one
// " /path md5" a line.
func conffileSums(t Tree, list []byte) (string, error) {
	var b strings.Builder
	for _, line := range strings.Split(string(list), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		content, err := t.Read(mergedUsr(CleanPath(fields[0])))
		if err != nil {
			return "", fmt.Errorf("conffile %s: %w", fields[0], err)
		}
		sum := md5.Sum(content)
		fmt.Fprintf(&b, " %s %s\n", fields[0], hex.EncodeToString(sum[:]))
	}
	return b.String(), nil
}

// triggerInterests are the packages' trigger interests ("interest-noawait
// ldconfig", "interest /usr/share/...") as dpkg indexes them in
// /var/lib/dpkg/triggers: by trigger name, or by path in triggers/File.
type triggerInterests map[string][]string // trigger -> "package[/noawait]"

func (ti triggerInterests) add(pkg string, triggers []byte) {
	for _, line := range strings.Split(string(triggers), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		suffix := ""
		switch f[0] {
		case "interest", "interest-await":
		case "interest-noawait":
			suffix = "/noawait"
		default:
			continue // activations, comments
		}
		ti[f[1]] = append(ti[f[1]], pkg+suffix)
	}
}

func (ti triggerInterests) write(t Tree) {
	var files strings.Builder
	names := make([]string, 0, len(ti))
	for n := range ti {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if strings.HasPrefix(n, "/") {
			for _, p := range ti[n] {
				files.WriteString(n + " " + p + "\n")
			}
			continue
		}
		t.File("var/lib/dpkg/triggers/"+n, []byte(strings.Join(ti[n], "\n")+"\n"), 0o644)
	}
	t.File("var/lib/dpkg/triggers/File", []byte(files.String()), 0o644)
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

// unpackTar adds one package's data archive to t and appends the paths it
// keeps, as dpkg lists them ("/.", "/bin", "/bin/bash", ...), to list.
func unpackTar(t Tree, staging string, r io.Reader, n *int, exclude func(string) bool, list *[]string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		orig := CleanPath(h.Name)
		if orig == "" {
			*list = append(*list, "/.")
			continue
		}
		if exclude != nil && exclude(orig) {
			continue
		}
		p := mergedUsr(orig)
		mode := h.Mode & 0o7777
		switch h.Typeflag {
		case tar.TypeDir:
			if e, ok := t[p]; ok && e.Type == tar.TypeSymlink {
				break // a merged-/usr link stays a link
			}
			t.Dir(p, mode, h.Uid, h.Gid)
		case tar.TypeSymlink:
			t.Symlink(p, h.Linkname)
		case tar.TypeLink:
			// A copy rather than a hard link: the layer's sorted order may
			// put the link before its target.
			target, ok := t[mergedUsr(CleanPath(h.Linkname))]
			if !ok || target.Type != tar.TypeReg {
				return fmt.Errorf("%s: hard link to %s, which is not a file before it", h.Name, h.Linkname)
			}
			t[p] = &Entry{Type: tar.TypeReg, Mode: mode, UID: h.Uid, GID: h.Gid, Src: target.Src, Data: target.Data}
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
			t[p] = &Entry{Type: tar.TypeReg, Mode: mode, UID: h.Uid, GID: h.Gid, Src: dst}
		default:
			// Device nodes and fifos: none in Debian's packages, and a
			// container runtime or the guest's init provides /dev.
			continue
		}
		*list = append(*list, "/"+orig)
	}
}

// HostPackageVersion is the version of an installed Debian package of the
// build host (dpkg-query), for files an image takes from the host.
func HostPackageVersion(name string) (string, error) {
	out, err := exec.Command("dpkg-query", "-W", "-f=${Version}", name).Output()
	if err != nil || len(out) == 0 {
		return "", fmt.Errorf("the build host's Debian package %s is not installed (apt-get install %s)", name, name)
	}
	return string(out), nil
}
