package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"

	"github.com/zyvor/kairon/internal/guestagent/agent"
)

// The subcommands an image guest's init runs (hack/guest/init), once per
// boot each: prepare-root before anything runs in the image, main for the
// image's main process. They live in the agent's binary because the image
// may have no program of its own to do it with, and the initramfs has room
// for one static binary.
var subcommands = map[string]func(args []string) int{
	"prepare-root": prepareRoot,
	"main":         runMain,
}

// prepareRoot mounts the kernel's filesystems in the image's root and
// writes its identity files (agent.PrepareRoot).
func prepareRoot(args []string) int {
	fs := flag.NewFlagSet("prepare-root", flag.ContinueOnError)
	root := fs.String("root", "", "the image's root (the overlay)")
	config := fs.String("config", "", "the image's config (internal/imagefs's config.json)")
	hostname := fs.String("hostname", "", "the guest's hostname (kairon.hostname)")
	address := fs.String("address", "", "the guest's address, ADDR or ADDR/PREFIX (kairon.ip), which /etc/hosts gives the hostname")
	dns := fs.String("dns", "", "nameservers of /etc/resolv.conf, comma-separated (kairon.dns)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	img, err := agent.LoadImage(*root, *config)
	if err != nil {
		log.Error("prepare-root", "err", err)
		return 1
	}
	id := agent.GuestIdentity{Hostname: *hostname}
	if a := *address; a != "" {
		if p, err := netip.ParsePrefix(a); err == nil {
			id.Address = p.Addr()
		} else if id.Address, err = netip.ParseAddr(a); err != nil {
			log.Error("prepare-root", "err", fmt.Errorf("--address %q: want ADDR or ADDR/PREFIX", a))
			return 2
		}
	}
	for d := range strings.SplitSeq(*dns, ",") {
		if d = strings.TrimSpace(d); d == "" {
			continue
		}
		if _, err := netip.ParseAddr(d); err != nil {
			log.Error("prepare-root", "err", fmt.Errorf("--dns %q: not an IP address", d))
			return 2
		}
		id.DNS = append(id.DNS, d)
	}
	if err := agent.PrepareRoot(agent.RootSetup{Root: img.Root, Identity: id, WorkingDir: img.Config.WorkingDir}); err != nil {
		log.Error("prepare-root", "root", img.Root, "err", err)
		return 1
	}
	return 0
}

// runMain runs the image's main process once, its output on this
// process's (the console), and records its state (agent.RunMain).
func runMain(args []string) int {
	fs := flag.NewFlagSet("main", flag.ContinueOnError)
	root := fs.String("root", "", "the image's root (the overlay)")
	config := fs.String("config", "", "the image's config (internal/imagefs's config.json)")
	state := fs.String("state", "", "the state file the guest agent reports (its --main-state)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if *state == "" {
		log.Error("main: --state is required")
		return 2
	}
	img, err := agent.LoadImage(*root, *config)
	if err != nil {
		log.Error("main", "err", err)
		return 1
	}
	m, err := agent.RunMain(img, os.Stdout, os.Stderr, *state)
	if err != nil {
		log.Error("main: recording the main process's state", "state", *state, "err", err)
		return 1
	}
	if m != nil {
		fmt.Fprintf(os.Stderr, "kairon: the image's main process %s\n", m)
	}
	return 0
}
