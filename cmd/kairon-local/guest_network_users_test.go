package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A fake process table: which processes use the guest network of which
// namespace, found by their arguments (a node agent's --netns) or by the
// namespace they run in (QEMU, an agent without --netns).
func TestGuestNetworkUsers(t *testing.T) {
	root, named := t.TempDir(), t.TempDir()
	defer func(p, n string) { procRoot, netnsDir = p, n }(procRoot, netnsDir)
	procRoot, netnsDir = root, named

	host := filepath.Join(t.TempDir(), "host-netns")
	for _, f := range []string{host, filepath.Join(named, "a"), filepath.Join(named, "b")} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A process is a directory with its cmdline and its ns/net, a hard
	// link to the file standing for its namespace (same inode).
	process := func(pid, netns string, argv ...string) {
		t.Helper()
		dir := filepath.Join(root, pid)
		if err := os.MkdirAll(filepath.Join(dir, "ns"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(strings.Join(argv, "\x00")+"\x00"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(netns, filepath.Join(dir, "ns", "net")); err != nil {
			t.Fatal(err)
		}
	}
	nsA := filepath.Join(named, "a")
	process("self", host, "kairon-local", "up")
	process("100", host, "/opt/kairon/bin/kairon-node", "--backend", "qemu", "--state-dir", "/data/one/nodes/node-1")
	process("101", host, "/opt/kairon/bin/kairon-node", "--backend=sim", "--state-dir", "/data/sim/nodes/node-1")
	process("102", host, "/opt/kairon/bin/kairon-node", "--netns", "a", "--state-dir", "/data/two/nodes/node-1")
	process("103", nsA, "/usr/bin/qemu-system-x86_64", "-name", "guest=web-1")
	process("104", host, "/opt/kairon/bin/kairon-local", "up", "--data-dir", "/data/three")
	process("105", host, "/usr/bin/vim", "kairon-node")

	hostIno, err := netnsInode("")
	if err != nil {
		t.Fatal(err)
	}
	aIno, err := netnsInode("a")
	if err != nil {
		t.Fatal(err)
	}
	bIno, err := netnsInode("b")
	if err != nil {
		t.Fatal(err)
	}
	names := func(users []guestNetworkUser) []string {
		var out []string
		for _, u := range users {
			out = append(out, u.String())
		}
		slices.Sort(out)
		return out
	}
	for _, tc := range []struct {
		name      string
		netns     uint64
		withLocal bool
		want      []string
	}{
		{"host: the agent without --netns", hostIno, false, []string{"kairon-node pid 100 of data dir /data/one"}},
		{"host, kairon-local too", hostIno, true, []string{"kairon-local pid 104", "kairon-node pid 100 of data dir /data/one"}},
		{"a: the agent by its --netns, QEMU by where it runs", aIno, false, []string{"kairon-node pid 102 of data dir /data/two", "qemu-system-x86_64 pid 103"}},
		{"b: nobody", bIno, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := names(guestNetworkUsers(tc.netns, tc.withLocal)); !slices.Equal(got, tc.want) {
				t.Errorf("users %q, want %q", got, tc.want)
			}
		})
	}

	err = guestNetworkFree("", "/data/mine")
	for _, want := range []string{"in this host's network namespace (kairon-node pid 100 of data dir /data/one)", "'kairon-local down --data-dir /data/one'", "'kairon-local up --netns NAME'"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("up in the host's namespace: %v, want an error containing %q", err, want)
		}
	}
	if err := guestNetworkFree("", "/data/one"); err != nil {
		t.Errorf("up of the data dir whose agent it is: %v, want nil (its lock speaks)", err)
	}
	if err := guestNetworkFree("b", "/data/mine"); err != nil {
		t.Errorf("up in a namespace of its own: %v", err)
	}
	if err := guestNetworkFree("nope", "/data/mine"); err == nil || !strings.Contains(err.Error(), "--netns nope: no such network namespace") {
		t.Errorf("up in a missing namespace: %v", err)
	}
}
