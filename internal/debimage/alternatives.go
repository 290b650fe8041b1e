package debimage

import (
	"archive/tar"
	"fmt"
	"path"
	"strings"
)

// Alt is one `update-alternatives --install Link Name Target Priority
// [--slave Link Name Target]...` of a maintainer script.
type Alt struct {
	Link, Name, Target string
	Priority           int
	Slaves             []Alt // Link, Name and Target only
}

// Alternative does what update-alternatives --install does when a.Target
// is the only choice for a.Name: a.Link points at /etc/alternatives/Name,
// which points at a.Target (the same for each slave whose target is in the
// image; the others are left out, as update-alternatives leaves them), and
// dpkg's alternatives database records the choice in auto mode, so that a
// package installed later that offers Name too is weighed against it.
func Alternative(t Tree, a Alt) error {
	var slaves []Alt
	for _, s := range append([]Alt{a}, a.Slaves...) {
		if s.Name == "" || path.Base(s.Name) != s.Name {
			return fmt.Errorf("alternative %q: not a plain name", s.Name)
		}
		e, ok := t[CleanPath(s.Target)]
		if !ok || e.Type == tar.TypeDir {
			if s.Name == a.Name {
				return fmt.Errorf("alternative %s: %s is not in the image", a.Name, a.Target)
			}
			continue
		}
		t.Symlink(s.Link, "/etc/alternatives/"+s.Name)
		t.Symlink("etc/alternatives/"+s.Name, s.Target)
		if s.Name != a.Name {
			slaves = append(slaves, s)
		}
	}
	// The database's format: mode, link, each slave's name and link, an
	// empty line, then each choice: its target, priority and slaves'
	// targets, then an empty line.
	var b strings.Builder
	fmt.Fprintf(&b, "auto\n%s\n", path.Clean("/"+a.Link))
	for _, s := range slaves {
		fmt.Fprintf(&b, "%s\n%s\n", s.Name, path.Clean("/"+s.Link))
	}
	fmt.Fprintf(&b, "\n%s\n%d\n", path.Clean("/"+a.Target), a.Priority)
	for _, s := range slaves {
		fmt.Fprintf(&b, "%s\n", path.Clean("/"+s.Target))
	}
	b.WriteString("\n")
	t.File("var/lib/dpkg/alternatives/"+a.Name, []byte(b.String()), 0o644)
	return nil
}
