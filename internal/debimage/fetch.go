package debimage

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// debFile finds the downloaded .deb of p in dir ("" if none): apt-get
// download names it name_version_arch.deb with the epoch's colon as %3a.
func debFile(dir string, p Package) string {
	matches, _ := filepath.Glob(filepath.Join(dir, p.Name+"_"+strings.ReplaceAll(p.Version, ":", "%3a")+"_*.deb"))
	if len(matches) == 0 {
		return ""
	}
	return matches[0]
}

// Fetch downloads the packages missing from cache with apt-get download
// and returns every package's .deb by package name. progress, if not nil,
// is told when a download starts.
func Fetch(cache string, pkgs []Package, progress io.Writer) (map[string]string, error) {
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
		if progress != nil {
			fmt.Fprintf(progress, "downloading %d Debian packages into %s\n", len(missing), cache)
		}
		cmd := exec.Command("apt-get", append([]string{"download", "-qq"}, missing...)...)
		cmd.Dir = cache
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("apt-get download: %w: %s\n(a version of the lock file no longer in the archive? regenerate the lock)", err, out)
		}
	}
	debs := map[string]string{}
	for _, p := range pkgs {
		f := debFile(cache, p)
		if f == "" {
			return nil, fmt.Errorf("apt-get download left no .deb for %s in %s", p, cache)
		}
		debs[p.Name] = f
	}
	return debs, nil
}
