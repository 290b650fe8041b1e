package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Users of an image: user[:group] (the image config's User, or an exec's),
// resolved with the image's own /etc/passwd and /etc/group as Docker and
// runc do. Both files are the image's, so untrusted: they are read through
// the root (inroot.go), bounded, and a line that does not parse is skipped.
// A numeric user or group needs neither file.

const (
	// maxAccountFileBytes bounds /etc/passwd and /etc/group.
	maxAccountFileBytes = 1 << 20
	// maxGroups bounds a user's supplementary groups.
	maxGroups  = 64
	passwdFile = "/etc/passwd"
	groupFile  = "/etc/group"
)

// passwdEntry is one line of /etc/passwd.
type passwdEntry struct {
	Name     string
	UID, GID uint32
	Home     string
}

// groupEntry is one line of /etc/group.
type groupEntry struct {
	Name    string
	GID     uint32
	Members []string
}

// Identity is who a command runs as.
type Identity struct {
	UID, GID uint32
	// Groups are the supplementary groups.
	Groups []uint32
	// Home is the user's home directory (HOME).
	Home string
}

// parseID reads a uid or gid: decimal, below 2^32-1 (which is -1, "no
// id", to the kernel).
func parseID(s string) (uint32, bool) {
	if s == "" || len(s) > 10 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 1<<32-1 {
		return 0, false
	}
	return uint32(n), true
}

// accountLines splits an account file into the fields of each line, at
// most maxAccountFileBytes of it; comments, blank lines and lines with a
// NUL are skipped.
func accountLines(data []byte) [][]string {
	var out [][]string
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) == 0 || line[0] == '#' || bytes.IndexByte(line, 0) >= 0 {
			continue
		}
		out = append(out, strings.Split(string(line), ":"))
	}
	return out
}

// parsePasswd parses /etc/passwd: name:password:uid:gid:gecos:home:shell.
// Entries without a name or with ids that do not parse are skipped.
func parsePasswd(data []byte) []passwdEntry {
	var out []passwdEntry
	for _, f := range accountLines(data) {
		if len(f) < 4 || f[0] == "" {
			continue
		}
		uid, ok1 := parseID(f[2])
		gid, ok2 := parseID(f[3])
		if !ok1 || !ok2 {
			continue
		}
		e := passwdEntry{Name: f[0], UID: uid, GID: gid}
		if len(f) >= 6 {
			e.Home = f[5]
		}
		out = append(out, e)
	}
	return out
}

// parseGroup parses /etc/group: name:password:gid:member,member...
func parseGroup(data []byte) []groupEntry {
	var out []groupEntry
	for _, f := range accountLines(data) {
		if len(f) < 3 || f[0] == "" {
			continue
		}
		gid, ok := parseID(f[2])
		if !ok {
			continue
		}
		e := groupEntry{Name: f[0], GID: gid}
		if len(f) >= 4 && f[3] != "" {
			for m := range strings.SplitSeq(f[3], ",") {
				if m = strings.TrimSpace(m); m != "" {
					e.Members = append(e.Members, m)
				}
			}
		}
		out = append(out, e)
	}
	return out
}

// readAccountFile reads name (/etc/passwd or /etc/group) inside root; a
// file that is not there reads as empty.
func readAccountFile(root, name string) ([]byte, error) {
	f, err := openInRoot(root, name, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return nil, err
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("the image's %s is not a regular file", name)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxAccountFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading the image's %s: %w", name, err)
	}
	if len(data) > maxAccountFileBytes {
		return nil, fmt.Errorf("the image's %s is larger than %d bytes", name, maxAccountFileBytes)
	}
	return data, nil
}

// accounts reads what resolveUser needs from the image: /etc/passwd, and
// /etc/group.
type accounts struct {
	passwd []passwdEntry
	group  []groupEntry
}

func readAccounts(root string) (accounts, error) {
	var a accounts
	p, err := readAccountFile(root, passwdFile)
	if err != nil {
		return a, err
	}
	g, err := readAccountFile(root, groupFile)
	if err != nil {
		return a, err
	}
	return accounts{passwd: parsePasswd(p), group: parseGroup(g)}, nil
}

// resolveUser turns spec (user[:group], each a name or an id; empty:
// root) into an Identity. A named user or group must be in the files; a
// numeric one need not be. The group is the user's primary one (0 for a
// uid the files do not know) unless spec names one; the supplementary
// groups are then those that list the user by name, or the named group
// alone, as runc does.
func (a accounts) resolveUser(spec string) (Identity, error) {
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if userPart == "" {
		if hasGroup {
			return Identity{}, fmt.Errorf("user %q: no user before the group", spec)
		}
		userPart = "0"
	}
	var id Identity
	var entry *passwdEntry
	if uid, ok := parseID(userPart); ok {
		id.UID = uid
		for i := range a.passwd {
			if a.passwd[i].UID == uid {
				entry = &a.passwd[i]
				break
			}
		}
	} else {
		for i := range a.passwd {
			if a.passwd[i].Name == userPart {
				entry = &a.passwd[i]
				break
			}
		}
		if entry == nil {
			return Identity{}, fmt.Errorf("user %q: no such user in the image's %s", userPart, passwdFile)
		}
		id.UID = entry.UID
	}
	switch {
	case entry != nil && entry.Home != "":
		id.Home = entry.Home
	case id.UID == 0:
		id.Home = "/root"
	default:
		id.Home = "/"
	}
	if entry != nil {
		id.GID = entry.GID
	}
	if hasGroup {
		if groupPart == "" {
			return Identity{}, fmt.Errorf("user %q: an empty group", spec)
		}
		if gid, ok := parseID(groupPart); ok {
			id.GID = gid
		} else {
			found := false
			for _, g := range a.group {
				if g.Name == groupPart {
					id.GID, found = g.GID, true
					break
				}
			}
			if !found {
				return Identity{}, fmt.Errorf("group %q: no such group in the image's %s", groupPart, groupFile)
			}
		}
		id.Groups = []uint32{id.GID}
		return id, nil
	}
	if entry != nil {
		for _, g := range a.group {
			if len(id.Groups) == maxGroups {
				break
			}
			for _, m := range g.Members {
				if m == entry.Name {
					id.Groups = append(id.Groups, g.GID)
					break
				}
			}
		}
	}
	return id, nil
}
