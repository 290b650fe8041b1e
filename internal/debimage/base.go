package debimage

import (
	"archive/tar"
	"fmt"
	"path"
	"sort"
	"strings"
)

// ConfigureBase does, for each package of a Debian 12 base system that t
// holds, what its maintainer scripts do on a first install and an image
// needs: files copied from their packaged defaults (/etc/profile,
// /etc/nsswitch.conf, /etc/inputrc, root's dot files, /etc/shells,
// /etc/hosts), the directories base-files makes (/var/run and /var/lock
// as links into /run, /usr/local/*), the links update-alternatives makes
// (awk, which, rmt) and dash's claim on /bin/sh, the CA bundle, and the
// directories Python's postinsts make. A package t does not hold is
// skipped. Accounts are Accounts' to write.
//
// Byte-compiling Python's modules and ldconfig's cache, which need a
// program of the image to run, are CompilePython's and LDConfig's. Left
// out on purpose: debconf's database (every question keeps its default)
// and services (an image starts none).
func ConfigureBase(t Tree) error {
	for _, s := range baseSteps {
		if _, ok := t[CleanPath(s.when)]; !ok {
			continue
		}
		if err := s.do(t); err != nil {
			return fmt.Errorf("%s's postinst: %w", s.pkg, err)
		}
	}
	return nil
}

type baseStep struct {
	pkg  string
	when string // a file of pkg: the step runs if t holds it
	do   func(Tree) error
}

// installFromDefault is the postinsts' install_from_default: copy a
// packaged default into place.
func installFromDefault(pairs ...string) func(Tree) error {
	return func(t Tree) error {
		for i := 0; i+1 < len(pairs); i += 2 {
			if err := t.CopyFile(pairs[i], pairs[i+1]); err != nil {
				return err
			}
		}
		return nil
	}
}

var baseSteps = []baseStep{
	{"base-files", "usr/share/base-files/profile", func(t Tree) error {
		if err := installFromDefault(
			"usr/share/base-files/dot.profile", "root/.profile",
			"usr/share/base-files/dot.bashrc", "root/.bashrc",
			"usr/share/base-files/profile", "etc/profile",
			"usr/share/base-files/motd", "etc/motd",
		)(t); err != nil {
			return err
		}
		for _, d := range []string{"mnt", "srv", "opt", "etc/opt", "var/opt", "media",
			"usr/local", "usr/local/share", "usr/local/share/man", "usr/local/bin", "usr/local/games",
			"usr/local/lib", "usr/local/include", "usr/local/sbin", "usr/local/src", "usr/local/etc"} {
			t.Dir(d, 0o755, 0, 0)
		}
		const mailGID, utmpGID = 8, 43
		t.Dir("var/mail", 0o2775, 0, mailGID)
		t.Symlink("var/spool/mail", "../mail")
		t.Dir("run", 0o755, 0, 0)
		t.Dir("run/lock", 0o1777, 0, 0)
		t.Symlink("var/run", "/run")
		t.Symlink("var/lock", "/run/lock")
		t.Symlink("usr/local/man", "share/man")
		t.Symlink("etc/dpkg/origins/default", "debian")
		for f, mode := range map[string]int64{"var/log/wtmp": 0o664, "var/log/btmp": 0o660, "var/log/lastlog": 0o664} {
			t.File(f, nil, mode)
			t[f].GID = utmpGID
		}
		return nil
	}},
	{"libc-bin", "usr/share/libc-bin/nsswitch.conf", installFromDefault("usr/share/libc-bin/nsswitch.conf", "etc/nsswitch.conf")},
	{"readline-common", "usr/share/readline/inputrc", installFromDefault("usr/share/readline/inputrc", "etc/inputrc")},
	{"debianutils", "usr/share/debianutils/shells", updateShells},
	{"debianutils", "usr/bin/which.debianutils", func(t Tree) error {
		return Alternative(t, Alt{Link: "usr/bin/which", Name: "which", Target: "/usr/bin/which.debianutils", Priority: 0})
	}},
	{"mawk", "usr/bin/mawk", func(t Tree) error {
		return Alternative(t, Alt{Link: "usr/bin/awk", Name: "awk", Target: "/usr/bin/mawk", Priority: 5,
			Slaves: []Alt{{Link: "usr/bin/nawk", Name: "nawk", Target: "/usr/bin/mawk"}}})
	}},
	{"tar", "usr/sbin/rmt-tar", func(t Tree) error {
		return Alternative(t, Alt{Link: "usr/sbin/rmt", Name: "rmt", Target: "/usr/sbin/rmt-tar", Priority: 50})
	}},
	{"dash", "usr/bin/dash", func(t Tree) error {
		// dash diverts bash's /bin/sh and makes it a link to itself.
		// (The link itself comes in dash's package.)
		t.File("var/lib/dpkg/diversions", []byte("/bin/sh\n/bin/sh.distrib\ndash\n"), 0o644)
		return nil
	}},
	{"netbase", "etc/protocols", func(t Tree) error {
		t.File("etc/hosts", []byte("127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\nff02::1\t\tip6-allnodes\nff02::2\t\tip6-allrouters\n"), 0o644)
		t.File("etc/networks", []byte("default\t\t0.0.0.0\nloopback\t127.0.0.0\nlink-local\t169.254.0.0\n"), 0o644)
		return nil
	}},
	{"ca-certificates", "usr/sbin/update-ca-certificates", func(t Tree) error {
		_, err := CACertificates(t)
		return err
	}},
	{"libpam-modules", "etc/security/limits.conf", func(t Tree) error {
		t.File("etc/security/opasswd", nil, 0o600)
		t.File("etc/environment", nil, 0o644)
		return nil
	}},
	// python3's postinst; the file is python3-minimal's, which python3
	// depends on.
	{"python3", "usr/share/python3/debian_defaults", func(t Tree) error {
		t.File("etc/python3/debian_config", []byte("[DEFAULT]\nbyte-compile = standard\n"), 0o644)
		return nil
	}},
	{"python3.11-minimal", "usr/bin/python3.11", func(t Tree) error {
		t.Dir("usr/local/lib/python3.11", 0o755, 0, 0)
		t.Dir("usr/local/lib/python3.11/dist-packages", 0o755, 0, 0)
		t.File("var/lib/python/python3.11_installed", nil, 0o644)
		return nil
	}},
}

// updateShells is debianutils' update-shells on a fresh system: the
// template /etc/shells, then the shells packages declare, each also under
// its merged-/usr name.
func updateShells(t Tree) error {
	template, err := t.Read("usr/share/debianutils/shells")
	if err != nil {
		return err
	}
	var decl []string
	for p, e := range t {
		if strings.HasPrefix(p, "usr/share/debianutils/shells.d/") && e.Type == tar.TypeReg {
			decl = append(decl, p)
		}
	}
	sort.Strings(decl)
	var out, state strings.Builder
	seen := map[string]bool{}
	add := func(s string) {
		if !seen[s] {
			seen[s] = true
			out.WriteString(s + "\n")
			state.WriteString(s + "\n")
		}
	}
	for _, f := range append([]string{"usr/share/debianutils/shells"}, decl...) {
		b := template
		if f != "usr/share/debianutils/shells" {
			if b, err = t.Read(f); err != nil {
				return err
			}
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "#") {
				if f == "usr/share/debianutils/shells" {
					out.WriteString(line + "\n")
				}
				continue
			}
			line, _, _ = strings.Cut(line, "#")
			if line = strings.TrimSpace(line); line == "" {
				continue
			}
			add(line)
			if m := "/" + mergedUsr(CleanPath(line)); m != path.Clean(line) {
				add(m)
			}
		}
	}
	t.File("etc/shells", []byte(out.String()), 0o644)
	t.File("var/lib/shells.state", []byte(state.String()), 0o644)
	return nil
}
