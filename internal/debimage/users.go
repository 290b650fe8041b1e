package debimage

import (
	"fmt"
	"path"
	"strings"
	"time"
)

// User is an account added to an image besides Debian's system accounts,
// with a group of its own name and id.
type User struct {
	Name     string
	UID, GID int
	Gecos    string
	Home     string
	Shell    string
}

// Accounts writes /etc/passwd, /etc/group, /etc/shadow and /etc/gshadow:
// the system accounts of base-passwd's master files (which its preinst and
// postinst copy), passwords moved to the shadow files as the passwd
// package's postinst (shadowconfig on) does, then users, each with a group
// of its own and a home directory filled from /etc/skel, as adduser makes
// them. Every password is locked: nobody logs in, exec needs none. date
// is the shadow files' date of the last password change.
func Accounts(t Tree, date time.Time, users ...User) error {
	passwd, err := t.Read("usr/share/base-passwd/passwd.master")
	if err != nil {
		return fmt.Errorf("base-passwd's accounts: %w", err)
	}
	group, err := t.Read("usr/share/base-passwd/group.master")
	if err != nil {
		return fmt.Errorf("base-passwd's groups: %w", err)
	}
	pw, err := parseColonFile("passwd.master", passwd, 7)
	if err != nil {
		return err
	}
	gr, err := parseColonFile("group.master", group, 4)
	if err != nil {
		return err
	}
	for _, u := range users {
		if u.Name == "" || strings.ContainsAny(u.Name+u.Gecos+u.Home+u.Shell, ":\n") {
			return fmt.Errorf("user %q: a name is required, and no field may hold ':' or a newline", u.Name)
		}
		for _, e := range pw {
			if e[0] == u.Name || e[2] == fmt.Sprint(u.UID) {
				return fmt.Errorf("user %s (uid %d): taken by the system account %s (uid %s)", u.Name, u.UID, e[0], e[2])
			}
		}
		for _, e := range gr {
			if e[0] == u.Name || e[2] == fmt.Sprint(u.GID) {
				return fmt.Errorf("group %s (gid %d): taken by the system group %s (gid %s)", u.Name, u.GID, e[0], e[2])
			}
		}
		pw = append(pw, []string{u.Name, "x", fmt.Sprint(u.UID), fmt.Sprint(u.GID), u.Gecos, u.Home, u.Shell})
		gr = append(gr, []string{u.Name, "x", fmt.Sprint(u.GID), ""})
	}
	days := date.Unix() / 86400
	var p, s, g, gs strings.Builder
	for _, e := range pw {
		e[1] = "x"
		p.WriteString(strings.Join(e, ":") + "\n")
		fmt.Fprintf(&s, "%s:*:%d:0:99999:7:::\n", e[0], days)
	}
	for _, e := range gr {
		e[1] = "x"
		g.WriteString(strings.Join(e, ":") + "\n")
		fmt.Fprintf(&gs, "%s:*::%s\n", e[0], e[3])
	}
	shadowGID := 0
	for _, e := range gr {
		if e[0] == "shadow" {
			fmt.Sscan(e[2], &shadowGID)
		}
	}
	t.File("etc/passwd", []byte(p.String()), 0o644)
	t.File("etc/group", []byte(g.String()), 0o644)
	t.File("etc/shadow", []byte(s.String()), 0o640)
	t.File("etc/gshadow", []byte(gs.String()), 0o640)
	t[CleanPath("etc/shadow")].GID = shadowGID
	t[CleanPath("etc/gshadow")].GID = shadowGID

	for _, u := range users {
		if u.Home == "" || u.Home == "/nonexistent" {
			continue
		}
		t.Dir(u.Home, 0o700, u.UID, u.GID)
		copies := map[string]*Entry{}
		for p, e := range t {
			if rel, ok := strings.CutPrefix(p, "etc/skel/"); ok {
				c := *e
				c.UID, c.GID = u.UID, u.GID
				copies[CleanPath(path.Join(u.Home, rel))] = &c
			}
		}
		for p, e := range copies {
			t[p] = e
		}
	}
	return nil
}

// parseColonFile splits a passwd- or group-style file into its entries of
// n fields.
func parseColonFile(name string, data []byte, n int) ([][]string, error) {
	var out [][]string
	for i, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ":")
		if len(f) != n {
			return nil, fmt.Errorf("%s:%d: %d fields, want %d", name, i+1, len(f), n)
		}
		out = append(out, f)
	}
	return out, nil
}
