package userimages

import (
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/zyvor/kairon/internal/debimage"
)

// Python is kairon/python:3.11: Debian 12's Python 3.11 with pip, venv,
// git, curl and the CA certificates, a Debian base system (bash,
// coreutils, apt, ...), and the non-root user kairon it runs as.
var Python = Image{
	Repository:  "kairon/python",
	Tag:         "3.11",
	Description: "Debian 12's Python 3.11 with pip, venv, git and curl, run as the user kairon (uid 1000); built by Kairon from Debian packages",
	lock:        pythonLock,
	recipe:      6,
	build:       buildPython,
}

//go:embed python.lock
var pythonLock []byte

// PythonRoots are the packages kairon/python asks for; python.lock holds
// them and everything they depend on (no recommends).
var PythonRoots = []string{
	// What Debian's essential set gives any shell script: the shells, the
	// core utilities, and the files /etc needs.
	"base-files", "base-passwd", "bash", "coreutils", "dash", "debianutils", "diffutils",
	"findutils", "grep", "gzip", "hostname", "libc-bin", "mawk", "ncurses-base", "ncurses-bin",
	"sed", "tar", "netbase",
	// apt, so that a Containerfile FROM the image can add Debian packages.
	"apt",
	// What the image is for.
	"python3", "python3-pip", "python3-venv", "python-is-python3", "git", "curl", "ca-certificates",
}

// PythonLockHeader heads python.lock.
const PythonLockHeader = `The Debian packages of kairon/python:3.11 (package userimages): the closure of
%s
without recommends, one package=version a line, and the date every file of
the image carries. Regenerate with: go run ./hack/images python --update-lock
`

// The image's user, as the Containerfiles of docs/guides/images.md
// expect it.
const (
	pythonUser = "kairon"
	pythonUID  = 1000
	pythonHome = "/home/kairon"
)

// slimExclude is what the image leaves out of its packages, as Debian's
// slim container images do: documentation other than copyright files,
// manual pages and translations. dpkgExcludes tells dpkg, so that packages
// installed later leave out the same.
func slimExclude(p string) bool {
	for _, d := range []string{"usr/share/man/", "usr/share/info/", "usr/share/locale/", "usr/share/groff/", "usr/share/lintian/", "usr/share/linda/"} {
		if strings.HasPrefix(p+"/", d) && p+"/" != d {
			return true
		}
	}
	if rest, ok := strings.CutPrefix(p, "usr/share/doc/"); ok {
		_, file, nested := strings.Cut(rest, "/")
		return !(nested && file == "copyright")
	}
	return false
}

const dpkgExcludes = `# Left out of every package, as in kairon/python's own packages
# (documentation but copyright files, manual pages, translations).
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
`

// pipConf lets pip install for a user without a venv. Debian marks its
// Python externally managed (PEP 668: /usr/lib/python3.11/EXTERNALLY-MANAGED)
// so that pip does not mix with apt's packages; the image's user installs
// into ~/.local, which apt never touches, and root into /usr/local.
const pipConf = `# kairon/python: pip install works without a venv. A non-root user's
# packages go to ~/.local (the user's site-packages, ~/.local/bin on PATH),
# root's to /usr/local; apt's stay apart in /usr/lib/python3/dist-packages.
# Debian refuses this by default (PEP 668); a venv (python3 -m venv) works
# as usual and ignores this file's first setting.
[global]
break-system-packages = true
disable-pip-version-check = true
`

const aptSources = `Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
`

// PythonPath is the image's PATH: the user's pip-installed commands first.
const PythonPath = "PATH=" + pythonHome + "/.local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func buildPython(b *build) (v1.Image, error) {
	staging := filepath.Join(b.work, "files")
	if err := os.MkdirAll(staging, 0o755); err != nil {
		return nil, err
	}
	t := debimage.Tree{}
	b.progress("unpacking %d Debian packages ...", len(b.lock.Packages))
	if err := debimage.Unpack(t, staging, b.lock.Packages, b.debs, debimage.UnpackOptions{Exclude: slimExclude, Database: true}); err != nil {
		return nil, err
	}
	if err := b.ctx.Err(); err != nil {
		return nil, err
	}
	if err := debimage.ConfigureBase(t); err != nil {
		return nil, err
	}
	if err := debimage.LDConfig(t, b.work, b.lock.Date); err != nil {
		return nil, err
	}
	if err := b.ctx.Err(); err != nil {
		return nil, err
	}
	b.progress("byte-compiling Python's modules ...")
	if _, err := debimage.CompilePython(t, b.work, b.lock.Date, "usr/bin/python3.11", "usr/lib/python3.11", "usr/lib/python3/dist-packages"); err != nil {
		return nil, err
	}
	if err := b.ctx.Err(); err != nil {
		return nil, err
	}
	if err := debimage.Accounts(t, b.lock.Date, debimage.User{
		Name: pythonUser, UID: pythonUID, GID: pythonUID, Gecos: "Kairon", Home: pythonHome, Shell: "/bin/bash",
	}); err != nil {
		return nil, err
	}
	for _, d := range []string{"dev", "proc", "sys", "home"} {
		t.Dir(d, 0o755, 0, 0)
	}
	t.Dir("tmp", 0o1777, 0, 0)
	t.Dir("var/tmp", 0o1777, 0, 0)
	t.Dir("root", 0o700, 0, 0)
	t.File("etc/pip.conf", []byte(pipConf), 0o644)
	t.File("etc/dpkg/dpkg.cfg.d/excludes", []byte(dpkgExcludes), 0o644)
	t.File("etc/apt/sources.list.d/debian.sources", []byte(aptSources), 0o644)
	// apt's working directories, as its package would leave them.
	for _, d := range []string{"var/lib/apt/lists/partial", "var/cache/apt/archives/partial"} {
		t.Dir(d, 0o700, 42, 0) // _apt
	}
	t.Dir("var/lib/apt/lists", 0o755, 0, 0)
	t.Dir("var/cache/apt/archives", 0o755, 0, 0)

	layers := []debimage.Layer{{Tree: t, CreatedBy: fmt.Sprintf("Debian packages %s and their dependencies (/usr/share/kairon/packages.tsv), configured as their maintainer scripts would; the user %s (uid %d)",
		strings.Join(PythonRoots, ", "), pythonUser, pythonUID)}}
	date := b.lock.Date
	return debimage.Assemble(b.work, date, "internal/userimages", layers, v1.Config{
		User:       fmt.Sprintf("%d:%d", pythonUID, pythonUID),
		WorkingDir: pythonHome,
		Env:        []string{PythonPath, "LANG=C.UTF-8"},
		Labels: map[string]string{
			"org.opencontainers.image.title":       b.image.Repository,
			"org.opencontainers.image.version":     b.image.Tag,
			"org.opencontainers.image.description": b.image.Description,
			"org.opencontainers.image.created":     date.Format(time.RFC3339),
			"org.opencontainers.image.source":      "https://github.com/zyvor/kairon",
			KeyLabel:                               b.image.Key(),
		},
	})
}
