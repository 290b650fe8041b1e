package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// Who uses a guest network. Every kairon-local's QEMU nodes put their
// guests on the bridge kairon0, in 10.88.0.0/16, with their egress proxies
// on the bridge's address: two kairon-locals whose nodes share a network
// namespace would share (and fight over) all of it. A node agent keeps its
// guests in its --netns, else in its own namespace; the agent process
// itself stays where it was started (only the threads that build the
// network enter --netns), so it is found by its arguments, not by its
// /proc/PID/ns/net.

// netnsDir is where named network namespaces are (ip netns add); tests
// point it elsewhere.
var netnsDir = "/run/netns"

// netnsInode identifies the network namespace named name (ip netns), or
// this process's own for "".
func netnsInode(name string) (uint64, error) {
	path := filepath.Join(procRoot, "self", "ns", "net")
	if name != "" {
		path = filepath.Join(netnsDir, name)
	}
	st, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return st.Sys().(*syscall.Stat_t).Ino, nil
}

// processNetns identifies the network namespace process pid runs in.
func processNetns(pid int) (uint64, bool) {
	st, err := os.Stat(filepath.Join(procRoot, strconv.Itoa(pid), "ns", "net"))
	if err != nil {
		return 0, false
	}
	return st.Sys().(*syscall.Stat_t).Ino, true
}

// flagValue is the value of flag name (without dashes) in argv, as Go's
// flag package reads it: -name V, --name V, -name=V or --name=V.
func flagValue(argv []string, name string) (string, bool) {
	for i, a := range argv {
		a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if a == name && i+1 < len(argv) {
			return argv[i+1], true
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// guestNetworkUser is a process that uses a guest network.
type guestNetworkUser struct {
	pid  int
	name string // kairon-node, qemu-system-x86_64, kairon-local
	// dataDir is the data dir of a node agent's kairon-local, from its
	// --state-dir (DATA/nodes/NODE); empty when not known.
	dataDir string
}

// listUsers is users for a message: "kairon-node pid 12 of data dir D, ...".
func listUsers(users []guestNetworkUser) string {
	names := make([]string, len(users))
	for i, u := range users {
		names[i] = u.String()
	}
	return strings.Join(names, ", ")
}

func (u guestNetworkUser) String() string {
	if u.dataDir != "" {
		return fmt.Sprintf("%s pid %d of data dir %s", u.name, u.pid, u.dataDir)
	}
	return fmt.Sprintf("%s pid %d", u.name, u.pid)
}

// guestNetworkUsers lists the processes (other than this one) using the
// guest network in the namespace with inode netns: node agents with VMs of
// their own (not sim) that keep their guests there, and QEMU processes
// running there; with alsoKaironLocal, kairon-local processes running
// there too (one may be about to start its agents).
func guestNetworkUsers(netns uint64, alsoKaironLocal bool) []guestNetworkUser {
	var users []guestNetworkUser
	_ = eachProcess(func(pid int, argv []string) bool {
		name := filepath.Base(argv[0])
		var uses bool
		switch {
		case name == "kairon-node":
			if backend, _ := flagValue(argv, "backend"); backend == "sim" {
				return false
			}
			if ns, ok := flagValue(argv, "netns"); ok && ns != "" {
				ino, err := netnsInode(ns)
				uses = err == nil && ino == netns
			} else {
				ino, ok := processNetns(pid)
				uses = ok && ino == netns
			}
		case strings.HasPrefix(name, "qemu-system") || (alsoKaironLocal && name == "kairon-local"):
			ino, ok := processNetns(pid)
			uses = ok && ino == netns
		}
		if uses {
			u := guestNetworkUser{pid: pid, name: name}
			if state, ok := flagValue(argv, "state-dir"); ok {
				u.dataDir = dataDirOf(state)
			}
			users = append(users, u)
		}
		return false
	})
	return users
}

// guestNetworkFree refuses to start QEMU nodes in netns ("" for this
// host's namespace) while another kairon-local's nodes keep their guests
// there, naming them and the way out. Nodes of dataDir itself are left to
// the data dir's lock, which says more.
func guestNetworkFree(netns, dataDir string) error {
	ino, err := netnsInode(netns)
	if errors.Is(err, os.ErrNotExist) && netns != "" {
		return fmt.Errorf("--netns %s: no such network namespace (create it with 'ip netns add %s')", netns, netns)
	}
	if err != nil {
		return fmt.Errorf("reading the network namespace: %w", err)
	}
	users := slices.DeleteFunc(guestNetworkUsers(ino, false), func(u guestNetworkUser) bool { return u.dataDir == dataDir })
	if len(users) == 0 {
		return nil
	}
	where := "this host's network namespace"
	if netns != "" {
		where = "network namespace " + netns
	}
	stop := ""
	if i := slices.IndexFunc(users, func(u guestNetworkUser) bool { return u.dataDir != "" }); i >= 0 {
		stop = fmt.Sprintf(" ('kairon-local down --data-dir %s')", users[i].dataDir)
	}
	return fmt.Errorf("another kairon-local's nodes keep their VMs in %s (%s), on the same bridge %s, addresses and egress proxy ports this one's nodes would use: stop it first%s, or give this one a network namespace of its own ('ip netns add NAME', then 'kairon-local up --netns NAME')",
		where, listUsers(users), guestBridge, stop)
}
