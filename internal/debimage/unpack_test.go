package debimage

import (
	"archive/tar"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// buildDeb makes a small .deb with dpkg-deb: files (path -> content) and
// control members (conffiles, postinst, triggers ...).
func buildDeb(t *testing.T, dir, name, version, multiArch string, files, control map[string]string) string {
	t.Helper()
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("dpkg-deb not found (a Debian host has it)")
	}
	root := filepath.Join(dir, name)
	for p, c := range files {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctl := "Package: " + name + "\nVersion: " + version + "\nArchitecture: amd64\nMaintainer: test <t@example.com>\nDescription: test package\n"
	if multiArch != "" {
		ctl += "Multi-Arch: " + multiArch + "\n"
	}
	control["control"] = ctl
	if err := os.MkdirAll(filepath.Join(root, "DEBIAN"), 0o755); err != nil {
		t.Fatal(err)
	}
	for m, c := range control {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(m, "inst") || strings.HasSuffix(m, "rm") {
			mode = 0o755
		}
		if err := os.WriteFile(filepath.Join(root, "DEBIAN", m), []byte(c), mode); err != nil {
			t.Fatal(err)
		}
	}
	deb := filepath.Join(dir, name+"_"+version+"_amd64.deb")
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", root, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v: %s", err, out)
	}
	return deb
}

// Unpack puts files where a merged-/usr system has them, leaves out what
// Exclude names, and writes the dpkg database a later dpkg and apt read:
// status with conffiles, file lists (named by architecture for Multi-Arch:
// same), the control archive's other members, and the trigger index.
func TestUnpackWritesTheDpkgDatabase(t *testing.T) {
	dir := t.TempDir()
	tool := buildDeb(t, dir, "tool", "1.0-1", "", map[string]string{
		"bin/tool":                     "#!/bin/sh\n",
		"etc/tool.conf":                "setting=1\n",
		"usr/share/doc/tool/copyright": "MIT\n",
		"usr/share/doc/tool/README":    "read me\n",
		"usr/share/man/man1/tool.1.gz": "man\n",
	}, map[string]string{
		"conffiles": "/etc/tool.conf\n",
		"postinst":  "#!/bin/sh\nexit 0\n",
		"triggers":  "interest-noawait tool-trigger\n",
	})
	lib := buildDeb(t, dir, "libtool1", "2:2.0", "same", map[string]string{
		"usr/lib/x86_64-linux-gnu/libtool.so.1": "elf",
	}, map[string]string{})
	pkgs := []Package{{"libtool1", "2:2.0"}, {"tool", "1.0-1"}}
	debs := map[string]string{"tool": tool, "libtool1": lib}
	staging := t.TempDir()
	tr := Tree{}
	exclude := func(p string) bool {
		return strings.HasPrefix(p, "usr/share/man/") || strings.HasPrefix(p, "usr/share/doc/") && !strings.HasSuffix(p, "/copyright")
	}
	if err := Unpack(tr, staging, pkgs, debs, UnpackOptions{Exclude: exclude, Database: true}); err != nil {
		t.Fatal(err)
	}
	if e := tr["usr/bin/tool"]; e == nil || e.Type != tar.TypeReg {
		t.Errorf("/bin/tool did not land in /usr/bin: %+v", e)
	}
	if e := tr["bin"]; e == nil || e.Type != tar.TypeSymlink || e.Link != "usr/bin" {
		t.Errorf("/bin is %+v, want a link to usr/bin", e)
	}
	for _, gone := range []string{"usr/share/man/man1/tool.1.gz", "usr/share/doc/tool/README"} {
		if _, ok := tr[gone]; ok {
			t.Errorf("/%s was not excluded", gone)
		}
	}
	if _, ok := tr["usr/share/doc/tool/copyright"]; !ok {
		t.Error("the copyright file was excluded")
	}
	status, _ := tr.Read("var/lib/dpkg/status")
	for _, want := range []string{
		"Package: tool\nStatus: install ok installed\n",
		"Conffiles:\n /etc/tool.conf 7d43cb06abb8273056a580aca18d8acb\n",
		"Package: libtool1\nStatus: install ok installed\n",
	} {
		if !strings.Contains(string(status), want) {
			t.Errorf("dpkg status lacks %q:\n%s", want, status)
		}
	}
	list, _ := tr.Read("var/lib/dpkg/info/tool.list")
	if got := string(list); !strings.Contains(got, "/.\n") || !strings.Contains(got, "/bin/tool\n") || strings.Contains(got, "README") || strings.Contains(got, "man1") {
		t.Errorf("tool.list lists the package's own paths but the excluded ones:\n%s", got)
	}
	if _, err := tr.Read("var/lib/dpkg/info/libtool1:amd64.list"); err != nil {
		t.Errorf("Multi-Arch: same package's list: %v", err)
	}
	if e := tr["var/lib/dpkg/info/tool.postinst"]; e == nil || e.Mode != 0o755 {
		t.Errorf("tool.postinst %+v, want the script, executable", e)
	}
	if _, ok := tr["var/lib/dpkg/info/tool.control"]; ok {
		t.Error("the control file was copied to info/; dpkg keeps it in status only")
	}
	if b, _ := tr.Read("var/lib/dpkg/triggers/tool-trigger"); string(b) != "tool/noawait\n" {
		t.Errorf("trigger index %q", b)
	}
	if b, _ := tr.Read("var/lib/dpkg/info/format"); string(b) != "1\n" {
		t.Errorf("info/format %q, want 1", b)
	}
	tsv, _ := tr.Read("usr/share/kairon/packages.tsv")
	if !strings.Contains(string(tsv), "libtool1\t2:2.0\tamd64\tlibtool1\n") {
		t.Errorf("packages.tsv:\n%s", tsv)
	}

	// A .deb whose version is not the lock's is refused.
	err := Unpack(Tree{}, t.TempDir(), []Package{{"tool", "1.0-2"}}, debs, UnpackOptions{})
	if err == nil || !strings.Contains(err.Error(), `version "1.0-1", the lock file says "1.0-2"`) {
		t.Errorf("Unpack of another version: %v", err)
	}
}
