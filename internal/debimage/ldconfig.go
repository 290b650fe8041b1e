package debimage

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// LDConfig writes /etc/ld.so.cache as libc-bin's postinst (ldconfig) does,
// with the image's own ldconfig on a copy of the tree under work (which
// must outlive t's use). The loader finds Debian's libraries without the
// cache, but ldconfig -p, and so Python's ctypes.util.find_library, need
// it. ldconfig chroots into the copy: as root directly, otherwise in a user
// namespace of its own (unshare -r).
func LDConfig(t Tree, work string, date time.Time) error {
	root := filepath.Join(work, "ldroot")
	if err := materialize(t, root, date); err != nil {
		return fmt.Errorf("copying the tree to run ldconfig: %w", err)
	}
	// -X: leave the libraries' links as the packages made them.
	args := []string{"/usr/sbin/ldconfig", "-X", "-r", root}
	args[0] = filepath.Join(root, args[0])
	if os.Geteuid() != 0 {
		args = append([]string{"unshare", "--user", "--map-root-user"}, args...)
	}
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%v: %w: %s", args, err, out)
	}
	cache := filepath.Join(root, "etc", "ld.so.cache")
	if _, err := os.Stat(cache); err != nil {
		return fmt.Errorf("ldconfig made no cache: %w", err)
	}
	t.FileFrom("etc/ld.so.cache", cache, 0o644)
	return nil
}
