package agent

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

const testPasswd = `root:x:0:0:root:/root:/bin/bash
# a comment

daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
app:x:1000:1000:App,,,:/home/app:/bin/sh
nohome:x:1001:1001
bad-uid:x:12a:1:::
too-big:x:4294967295:1:::
neg:x:-1:1:::
:x:5:5:::
dup:x:2000:2000::/first:
dup:x:2001:2001::/second:
nul:x:3000:3000::/ho` + "\x00" + `me:
crlf:x:3001:3001::/crlf:/bin/sh` + "\r" + `
`

const testGroup = `root:x:0:
daemon:x:1:
app:x:1000:
staff:x:50:app,other
wheel:x:10: app , root
docker:x:999:other
bad:x:x:app
`

func TestParsePasswd(t *testing.T) {
	got := parsePasswd([]byte(testPasswd))
	want := []passwdEntry{
		{Name: "root", UID: 0, GID: 0, Home: "/root"},
		{Name: "daemon", UID: 1, GID: 1, Home: "/usr/sbin"},
		{Name: "app", UID: 1000, GID: 1000, Home: "/home/app"},
		{Name: "nohome", UID: 1001, GID: 1001},
		{Name: "dup", UID: 2000, GID: 2000, Home: "/first"},
		{Name: "dup", UID: 2001, GID: 2001, Home: "/second"},
		{Name: "crlf", UID: 3001, GID: 3001, Home: "/crlf"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parsePasswd:\n got %+v\nwant %+v", got, want)
	}
}

func TestParseGroup(t *testing.T) {
	got := parseGroup([]byte(testGroup))
	want := []groupEntry{
		{Name: "root", GID: 0}, {Name: "daemon", GID: 1}, {Name: "app", GID: 1000},
		{Name: "staff", GID: 50, Members: []string{"app", "other"}},
		{Name: "wheel", GID: 10, Members: []string{"app", "root"}},
		{Name: "docker", GID: 999, Members: []string{"other"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseGroup:\n got %+v\nwant %+v", got, want)
	}
}

func TestResolveUser(t *testing.T) {
	acc := accounts{passwd: parsePasswd([]byte(testPasswd)), group: parseGroup([]byte(testGroup))}
	none := accounts{}
	for _, tc := range []struct {
		name string
		acc  accounts
		spec string
		want Identity
		err  string
	}{
		{"empty is root", acc, "", Identity{UID: 0, GID: 0, Groups: []uint32{10}, Home: "/root"}, ""},
		{"root without files", none, "", Identity{Home: "/root"}, ""},
		{"by name", acc, "app", Identity{UID: 1000, GID: 1000, Groups: []uint32{50, 10}, Home: "/home/app"}, ""},
		{"by uid", acc, "1000", Identity{UID: 1000, GID: 1000, Groups: []uint32{50, 10}, Home: "/home/app"}, ""},
		{"uid the files lack", acc, "4242", Identity{UID: 4242, GID: 0, Home: "/"}, ""},
		{"uid and gid without files", none, "4242:4343", Identity{UID: 4242, GID: 4343, Groups: []uint32{4343}, Home: "/"}, ""},
		{"name and group name", acc, "app:staff", Identity{UID: 1000, GID: 50, Groups: []uint32{50}, Home: "/home/app"}, ""},
		{"uid and group name", acc, "0:docker", Identity{UID: 0, GID: 999, Groups: []uint32{999}, Home: "/root"}, ""},
		{"name and gid", acc, "daemon:7", Identity{UID: 1, GID: 7, Groups: []uint32{7}, Home: "/usr/sbin"}, ""},
		{"no home", acc, "nohome", Identity{UID: 1001, GID: 1001, Home: "/"}, ""},
		{"first of a duplicate name", acc, "dup", Identity{UID: 2000, GID: 2000, Home: "/first"}, ""},
		{"the line with a NUL is gone", acc, "nul", Identity{}, `user "nul": no such user in the image's /etc/passwd`},
		{"unknown name", acc, "nobody", Identity{}, `user "nobody": no such user in the image's /etc/passwd`},
		{"name without files", none, "app", Identity{}, `user "app": no such user`},
		{"unknown group", acc, "app:nogroup", Identity{}, `group "nogroup": no such group in the image's /etc/group`},
		{"empty group", acc, "app:", Identity{}, "an empty group"},
		{"group alone", acc, ":staff", Identity{}, "no user before the group"},
		{"uid -1 is a name", acc, "4294967295", Identity{}, "no such user"},
		{"negative uid is a name", acc, "-1", Identity{}, "no such user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.acc.resolveUser(tc.spec)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("resolveUser(%q) = %+v, %v; want an error with %q", tc.spec, got, err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("resolveUser(%q) = %+v, %v; want %+v", tc.spec, got, err, tc.want)
			}
		})
	}
}

// The supplementary groups are bounded, whatever /etc/group lists.
func TestResolveUserBoundsGroups(t *testing.T) {
	var sb strings.Builder
	for i := range 500 {
		sb.WriteString("g" + strings.Repeat("x", i%7) + ":x:" + strconv.Itoa(100+i) + ":app\n")
	}
	acc := accounts{passwd: parsePasswd([]byte("app:x:1000:1000::/home/app:\n")), group: parseGroup([]byte(sb.String()))}
	id, err := acc.resolveUser("app")
	if err != nil || len(id.Groups) != maxGroups {
		t.Fatalf("%d groups, %v; want %d", len(id.Groups), err, maxGroups)
	}
}

// The account files are read inside the root, bounded, and must be
// regular files; a missing one reads as empty.
func TestReadAccounts(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	acc, err := readAccounts(root)
	if err != nil || acc.passwd != nil || acc.group != nil {
		t.Fatalf("no files: %+v %v", acc, err)
	}
	// /etc/passwd and /etc/group symlinks out of the root, to files that
	// would name users: read inside it, where there is nothing.
	outside := t.TempDir()
	for _, name := range []string{"passwd", "group"} {
		if err := os.WriteFile(filepath.Join(outside, name), []byte("evil:x:0:0::/:\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(outside, "passwd"), filepath.Join(root, "etc", "passwd")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(strings.Repeat("../", 20)+filepath.Join(outside, "group")[1:], filepath.Join(root, "etc", "group")); err != nil {
		t.Fatal(err)
	}
	acc, err = readAccounts(root)
	if err != nil || acc.passwd != nil || acc.group != nil {
		t.Fatalf("symlinks out of the root: %+v %v", acc, err)
	}
	os.Remove(filepath.Join(root, "etc", "passwd"))
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte(strings.Repeat("a:x:1:1:::\n", maxAccountFileBytes/10)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readAccounts(root); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a huge /etc/passwd: %v", err)
	}
	os.Remove(filepath.Join(root, "etc", "passwd"))
	if err := os.Mkdir(filepath.Join(root, "etc", "passwd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := readAccounts(root); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory at /etc/passwd: %v", err)
	}
}

// FuzzAccounts: whatever an image's /etc/passwd and /etc/group hold, the
// parsers do not panic, every entry they return has a name without a
// separator and a home without a NUL or newline, and resolving any user
// against them either fails or gives an identity with at most maxGroups
// groups.
func FuzzAccounts(f *testing.F) {
	f.Add([]byte(testPasswd), []byte(testGroup), "app")
	f.Add([]byte("root:x:0:0::/root:/bin/sh\n"), []byte("root:x:0:root\n"), "0:0")
	f.Add([]byte("::::::\n:\n\x00\n"), []byte(":::,,,,\n"), "1:")
	f.Add([]byte("a:b:99999999999:1\n"), []byte("g:x:4294967294:a,a,a\n"), "a:g")
	f.Fuzz(func(t *testing.T, passwd, group []byte, spec string) {
		acc := accounts{passwd: parsePasswd(passwd), group: parseGroup(group)}
		for _, e := range acc.passwd {
			if e.Name == "" || strings.ContainsAny(e.Name, ":\n\x00") || strings.ContainsAny(e.Home, ":\n\x00") || e.UID == 1<<32-1 || e.GID == 1<<32-1 {
				t.Fatalf("passwd entry %+v", e)
			}
		}
		for _, g := range acc.group {
			if g.Name == "" || strings.ContainsAny(g.Name, ":\n\x00") || g.GID == 1<<32-1 {
				t.Fatalf("group entry %+v", g)
			}
			for _, m := range g.Members {
				if m == "" || strings.ContainsAny(m, ",:\n\x00") {
					t.Fatalf("group member %q", m)
				}
			}
		}
		id, err := acc.resolveUser(spec)
		if err == nil && (len(id.Groups) > maxGroups || id.Home == "" || strings.ContainsAny(id.Home, "\n\x00")) {
			t.Fatalf("resolveUser(%q) = %+v", spec, id)
		}
	})
}
