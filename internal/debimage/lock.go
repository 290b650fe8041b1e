package debimage

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Package is one Debian binary package at one version.
type Package struct {
	Name, Version string
}

func (p Package) String() string { return p.Name + "=" + p.Version }

var instLine = regexp.MustCompile(`^Inst (\S+) \((\S+) `)

// Resolve asks apt for the packages an empty system needs to install roots
// without recommends, at the archive's current candidate versions, sorted
// by name.
func Resolve(roots []string) ([]Package, error) {
	empty, err := os.CreateTemp("", "kairon-debimage-status-")
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
	var pkgs []Package
	for _, line := range strings.Split(string(out), "\n") {
		if m := instLine.FindStringSubmatch(line); m != nil {
			pkgs = append(pkgs, Package{m[1], m[2]})
		}
	}
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("apt-get resolved no packages for %v (no package lists? run apt-get update): %s", roots, out)
	}
	sortPackages(pkgs)
	return pkgs, nil
}

func sortPackages(pkgs []Package) {
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].Name < pkgs[j].Name })
}

// Lock is the content of a lock file: the packages a build takes, and
// optionally the date its files carry.
//
// The file is one package=version a line; lines starting with # are
// comments, except "# source-date-epoch: N", which sets Date (seconds
// since 1970) for builds that have no commit to date them by.
type Lock struct {
	Packages []Package
	// Date is zero when the lock does not set one.
	Date time.Time
}

const dateDirective = "# source-date-epoch:"

// ParseLock reads a lock file's content; name is how errors refer to it.
func ParseLock(name string, data []byte) (Lock, error) {
	var l Lock
	seen := map[string]bool{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, dateDirective); ok {
			sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || sec <= 0 {
				return Lock{}, fmt.Errorf("%s:%d: %q: want %s <seconds since 1970>", name, i+1, line, dateDirective)
			}
			l.Date = time.Unix(sec, 0).UTC()
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		n, ver, ok := strings.Cut(line, "=")
		if !ok || n == "" || ver == "" || strings.ContainsAny(n+ver, " \t/") {
			return Lock{}, fmt.Errorf("%s:%d: %q is not package=version", name, i+1, line)
		}
		if seen[n] {
			return Lock{}, fmt.Errorf("%s:%d: package %s listed twice", name, i+1, n)
		}
		seen[n] = true
		l.Packages = append(l.Packages, Package{n, ver})
	}
	if len(l.Packages) == 0 {
		return Lock{}, fmt.Errorf("%s: no packages", name)
	}
	sortPackages(l.Packages)
	return l, nil
}

// ReadLock reads a lock file.
func ReadLock(file string) (Lock, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return Lock{}, err
	}
	return ParseLock(file, b)
}

// Format is the lock as a file: header (each of its lines made a comment),
// the date if set, then the packages.
func (l Lock) Format(header string) []byte {
	var b strings.Builder
	for _, h := range strings.Split(strings.TrimRight(header, "\n"), "\n") {
		b.WriteString(strings.TrimRight("# "+h, " ") + "\n")
	}
	if !l.Date.IsZero() {
		fmt.Fprintf(&b, "%s %d\n", dateDirective, l.Date.Unix())
	}
	pkgs := append([]Package(nil), l.Packages...)
	sortPackages(pkgs)
	for _, p := range pkgs {
		b.WriteString(p.String() + "\n")
	}
	return []byte(b.String())
}
