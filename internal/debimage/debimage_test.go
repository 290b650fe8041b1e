package debimage

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A layer's tar lists parents before children, every entry at the one
// date, with numeric owners only; the same tree gives the same bytes.
func TestLayerTarIsFixed(t *testing.T) {
	tr := Tree{}
	tr.File("usr/share/b", []byte("b"), 0o644)
	tr.File("etc/a", []byte("a"), 0o600)
	tr.Symlink("bin", "usr/bin")
	date := time.Unix(1700000000, 0).UTC()
	dir := t.TempDir()
	one, two := filepath.Join(dir, "1.tar"), filepath.Join(dir, "2.tar")
	if err := tr.WriteTar(one, date); err != nil {
		t.Fatal(err)
	}
	if err := tr.WriteTar(two, date); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(one)
	b, _ := os.ReadFile(two)
	if !bytes.Equal(a, b) {
		t.Fatal("two writes of one tree differ")
	}
	var names []string
	r := tar.NewReader(bytes.NewReader(a))
	for {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(date) || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: time %s, owner names %q %q", h.Name, h.ModTime, h.Uname, h.Gname)
		}
		names = append(names, h.Name)
	}
	want := "bin etc/ etc/a usr/ usr/share/ usr/share/b"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("entries %q, want %q", got, want)
	}
}

// Packages' /bin, /sbin and /lib land in /usr, as on a merged-/usr system.
func TestMergedUsr(t *testing.T) {
	for in, want := range map[string]string{
		"bin/dash": "usr/bin/dash", "lib64/ld-linux-x86-64.so.2": "usr/lib64/ld-linux-x86-64.so.2",
		"sbin/ip": "usr/sbin/ip", "usr/bin/ip": "usr/bin/ip", "etc/x": "etc/x", "binx/y": "binx/y", "bin": "usr/bin",
	} {
		if got := mergedUsr(in); got != want {
			t.Errorf("mergedUsr(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseLock(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    string // the packages, space-separated
		date    int64
		wantErr string
	}{
		{name: "sorted", in: "# header\nzlib1g=1:1.2\nbash=5.2\n", want: "bash=5.2 zlib1g=1:1.2"},
		{name: "dated", in: "# source-date-epoch: 1796688000\nbash=5.2\n", want: "bash=5.2", date: 1796688000},
		{name: "blank lines and spaces", in: "\n  bash=5.2  \n\n", want: "bash=5.2"},
		{name: "no version", in: "bash=\n", wantErr: `lock:1: "bash=" is not package=version`},
		{name: "no equals", in: "# x\nbash\n", wantErr: `lock:2: "bash" is not package=version`},
		{name: "space inside", in: "bash=5.2 extra\n", wantErr: "is not package=version"},
		{name: "twice", in: "bash=5.2\nbash=5.3\n", wantErr: "lock:2: package bash listed twice"},
		{name: "empty", in: "# only comments\n", wantErr: "lock: no packages"},
		{name: "bad date", in: "# source-date-epoch: soon\nbash=5.2\n", wantErr: "want # source-date-epoch: <seconds since 1970>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := ParseLock("lock", []byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range l.Packages {
				got = append(got, p.String())
			}
			if strings.Join(got, " ") != tt.want {
				t.Errorf("packages %q, want %q", got, tt.want)
			}
			if l.Date.Unix() != tt.date && !(tt.date == 0 && l.Date.IsZero()) {
				t.Errorf("date %v, want %d", l.Date, tt.date)
			}
		})
	}
}

// Format writes what ParseLock reads back, header as comments.
func TestLockFormatRoundTrips(t *testing.T) {
	l := Lock{Packages: []Package{{"zlib1g", "1:1.2"}, {"bash", "5.2"}}, Date: time.Unix(1796688000, 0).UTC()}
	b := l.Format("first line\nsecond line\n")
	want := "# first line\n# second line\n# source-date-epoch: 1796688000\nbash=5.2\nzlib1g=1:1.2\n"
	if string(b) != want {
		t.Errorf("Format:\n%s\nwant:\n%s", b, want)
	}
	back, err := ParseLock("x", b)
	if err != nil || len(back.Packages) != 2 || !back.Date.Equal(l.Date) {
		t.Errorf("ParseLock(Format) = %+v, %v", back, err)
	}
}

// Accounts starts from base-passwd's master files, moves passwords to the
// shadow files, and adds each user with a group and a home filled from
// /etc/skel that the user owns.
func TestAccounts(t *testing.T) {
	tr := Tree{}
	tr.File("usr/share/base-passwd/passwd.master", []byte("root:*:0:0:root:/root:/bin/bash\nnobody:*:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"), 0o644)
	tr.File("usr/share/base-passwd/group.master", []byte("root:*:0:\nshadow:*:42:\nnogroup:*:65534:\n"), 0o644)
	tr.File("etc/skel/.bashrc", []byte("# skel\n"), 0o644)
	date := time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC)
	if err := Accounts(tr, date, User{Name: "kairon", UID: 1000, GID: 1000, Gecos: "Kairon", Home: "/home/kairon", Shell: "/bin/bash"}); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		"etc/passwd":  "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nkairon:x:1000:1000:Kairon:/home/kairon:/bin/bash\n",
		"etc/group":   "root:x:0:\nshadow:x:42:\nnogroup:x:65534:\nkairon:x:1000:\n",
		"etc/shadow":  "root:*:20795:0:99999:7:::\nnobody:*:20795:0:99999:7:::\nkairon:*:20795:0:99999:7:::\n",
		"etc/gshadow": "root:*::\nshadow:*::\nnogroup:*::\nkairon:*::\n",
	} {
		got, err := tr.Read(file)
		if err != nil || string(got) != want {
			t.Errorf("%s = %q (%v), want %q", file, got, err, want)
		}
	}
	if e := tr["etc/shadow"]; e.Mode != 0o640 || e.GID != 42 {
		t.Errorf("/etc/shadow mode %o gid %d, want 0640 root:shadow", e.Mode, e.GID)
	}
	home, skel := tr["home/kairon"], tr["home/kairon/.bashrc"]
	if home == nil || home.Type != tar.TypeDir || home.UID != 1000 || home.GID != 1000 || home.Mode != 0o700 {
		t.Errorf("home %+v, want kairon's 0700 directory", home)
	}
	if skel == nil || skel.UID != 1000 || string(skel.Data) != "# skel\n" {
		t.Errorf("~/.bashrc %+v, want skel's, kairon's", skel)
	}

	for _, bad := range []User{
		{Name: "root2", UID: 0, GID: 2000},
		{Name: "nobody", UID: 2000, GID: 2000},
		{Name: "x", UID: 2000, GID: 42},
		{Name: "a:b", UID: 2000, GID: 2000},
		{Name: "", UID: 2000, GID: 2000},
	} {
		if err := Accounts(tr, date, bad); err == nil {
			t.Errorf("Accounts(%+v) accepted a clash or a bad name", bad)
		}
	}
}

// The bundle holds every certificate in the postinst's order, each ending
// in a newline; each is linked as a .pem named as update-ca-certificates
// names it.
func TestCACertificates(t *testing.T) {
	tr := Tree{}
	tr.File("usr/share/ca-certificates/mozilla/B_Root.crt", []byte("B"), 0o644) // no final newline
	tr.File("usr/share/ca-certificates/mozilla/A (x), y.crt", []byte("A\n"), 0o644)
	tr.File("usr/share/ca-certificates/mozilla/README", []byte("not a cert"), 0o644)
	n, err := CACertificates(tr)
	if err != nil || n != 2 {
		t.Fatalf("CACertificates = %d, %v; want 2", n, err)
	}
	if b, _ := tr.Read("etc/ssl/certs/ca-certificates.crt"); string(b) != "A\nB\n" {
		t.Errorf("bundle %q, want %q", b, "A\nB\n")
	}
	if conf, _ := tr.Read("etc/ca-certificates.conf"); !strings.HasSuffix(string(conf), "#\nmozilla/A (x), y.crt\nmozilla/B_Root.crt\n") {
		t.Errorf("ca-certificates.conf:\n%s", conf)
	}
	if l := tr["etc/ssl/certs/A_=x=__y.pem"]; l == nil || l.Link != "/usr/share/ca-certificates/mozilla/A (x), y.crt" {
		t.Errorf("the .pem link of 'A (x), y.crt': %+v", l)
	}
	if _, err := CACertificates(Tree{}); err == nil {
		t.Error("CACertificates without certificates succeeded")
	}
}

// The links and the database entry update-alternatives would write; a
// slave whose target the image lacks is left out.
func TestAlternative(t *testing.T) {
	tr := Tree{}
	tr.File("usr/bin/mawk", []byte("elf"), 0o755)
	err := Alternative(tr, Alt{Link: "usr/bin/awk", Name: "awk", Target: "/usr/bin/mawk", Priority: 5, Slaves: []Alt{
		{Link: "usr/bin/nawk", Name: "nawk", Target: "/usr/bin/mawk"},
		{Link: "usr/share/man/man1/awk.1.gz", Name: "awk.1.gz", Target: "/usr/share/man/man1/mawk.1.gz"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for link, want := range map[string]string{
		"usr/bin/awk": "/etc/alternatives/awk", "etc/alternatives/awk": "/usr/bin/mawk",
		"usr/bin/nawk": "/etc/alternatives/nawk", "etc/alternatives/nawk": "/usr/bin/mawk",
	} {
		if e := tr[link]; e == nil || e.Type != tar.TypeSymlink || e.Link != want {
			t.Errorf("/%s: %+v, want a link to %s", link, e, want)
		}
	}
	if _, ok := tr["usr/share/man/man1/awk.1.gz"]; ok {
		t.Error("the slave without a target got a link")
	}
	if db, _ := tr.Read("var/lib/dpkg/alternatives/awk"); string(db) != "auto\n/usr/bin/awk\nnawk\n/usr/bin/nawk\n\n/usr/bin/mawk\n5\n/usr/bin/mawk\n\n" {
		t.Errorf("alternatives database %q", db)
	}
	if err := Alternative(tr, Alt{Link: "usr/bin/x", Name: "x", Target: "/usr/bin/none"}); err == nil {
		t.Error("an alternative to a missing file was made")
	}
}

// /etc/shells: the template, then each shell packages declare, with its
// merged-/usr name after it.
func TestUpdateShells(t *testing.T) {
	tr := Tree{}
	tr.File("usr/share/debianutils/shells", []byte("# /etc/shells: valid login shells\n/bin/sh\n"), 0o644)
	tr.File("usr/share/debianutils/shells.d/dash", []byte("/bin/dash\n"), 0o644)
	tr.File("usr/share/debianutils/shells.d/bash", []byte("/bin/bash\n/bin/rbash # restricted\n"), 0o644)
	if err := updateShells(tr); err != nil {
		t.Fatal(err)
	}
	want := "# /etc/shells: valid login shells\n/bin/sh\n/usr/bin/sh\n/bin/bash\n/usr/bin/bash\n/bin/rbash\n/usr/bin/rbash\n/bin/dash\n/usr/bin/dash\n"
	if b, _ := tr.Read("etc/shells"); string(b) != want {
		t.Errorf("/etc/shells:\n%s\nwant:\n%s", b, want)
	}
}

// dpkg's trigger index: named triggers one file each, file triggers in
// triggers/File, noawait interests marked.
func TestTriggerInterests(t *testing.T) {
	ti := triggerInterests{}
	ti.add("libc-bin", []byte("# comment\ninterest-await ldconfig\nactivate-noawait ldconfig\n"))
	ti.add("debianutils", []byte("interest-noawait /usr/share/debianutils/shells.d\n"))
	ti.add("ca-certificates", []byte("interest update-ca-certificates\n"))
	tr := Tree{}
	ti.write(tr)
	for file, want := range map[string]string{
		"var/lib/dpkg/triggers/ldconfig":               "libc-bin\n",
		"var/lib/dpkg/triggers/update-ca-certificates": "ca-certificates\n",
		"var/lib/dpkg/triggers/File":                   "/usr/share/debianutils/shells.d debianutils/noawait\n",
	} {
		if b, err := tr.Read(file); err != nil || string(b) != want {
			t.Errorf("%s = %q (%v), want %q", file, b, err, want)
		}
	}
}
