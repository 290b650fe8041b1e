package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/zyvor/kairon/internal/guestagent/agent"
)

// The subcommands an image guest's init runs (hack/guest/init), once per
// boot each: prepare-root mounts the image and prepares its root before
// anything runs in it, main runs the image's main process. They live in the agent's binary because the image
// may have no program of its own to do it with, and the initramfs has room
// for one static binary.
var subcommands = map[string]func(args []string) int{
	"prepare-root": prepareRoot,
	"main":         runMain,
}

// prepareRoot mounts the image on --device under --dir (agent.MountImage),
// then mounts the kernel's filesystems in its root and writes its
// identity files (agent.PrepareRoot).
func prepareRoot(args []string) int {
	fs := flag.NewFlagSet("prepare-root", flag.ContinueOnError)
	device := fs.String("device", "", "the image's block device (/dev/ + kairon.image)")
	dir := fs.String("dir", "/image", "where the image is mounted: DIR/ro (the image), DIR/rw (its writable layer), DIR/root (the overlay, the guest's root)")
	wait := fs.Duration("wait", 5*time.Second, "how long to wait for the device to appear")
	hostname := fs.String("hostname", "", "the guest's hostname (kairon.hostname)")
	address := fs.String("address", "", "the guest's address, ADDR or ADDR/PREFIX (kairon.ip), which /etc/hosts gives the hostname")
	dns := fs.String("dns", "", "nameservers of /etc/resolv.conf, comma-separated (kairon.dns)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	fail := func(code int, err error) int {
		log.Error("prepare-root", "err", err)
		return code
	}
	id := agent.GuestIdentity{Hostname: *hostname}
	if a := *address; a != "" {
		if p, err := netip.ParsePrefix(a); err == nil {
			id.Address = p.Addr()
		} else if id.Address, err = netip.ParseAddr(a); err != nil {
			return fail(2, fmt.Errorf("--address %q: want ADDR or ADDR/PREFIX", a))
		}
	}
	for d := range strings.SplitSeq(*dns, ",") {
		if d = strings.TrimSpace(d); d == "" {
			continue
		}
		if _, err := netip.ParseAddr(d); err != nil {
			return fail(2, fmt.Errorf("--dns %q: not an IP address", d))
		}
		id.DNS = append(id.DNS, d)
	}
	if *device == "" {
		return fail(2, errors.New("--device is required"))
	}
	if err := waitBlockDevice(*device, *wait); err != nil {
		return fail(1, err)
	}
	m := agent.ImageMountsUnder(*dir)
	if err := agent.MountImage(*device, m); err != nil {
		return fail(1, err)
	}
	img, err := agent.LoadImage(m.Root, m.Config())
	if err != nil {
		return fail(1, err)
	}
	if err := agent.PrepareRoot(agent.RootSetup{Root: img.Root, Identity: id, WorkingDir: img.Config.WorkingDir}); err != nil {
		return fail(1, err)
	}
	return 0
}

// waitBlockDevice waits up to wait for the block device at path: its
// driver may still be probing the disk when the init gets here.
func waitBlockDevice(path string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		fi, err := os.Stat(path)
		if err == nil && fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New("not a block device")
			}
			return fmt.Errorf("the image's disk %s after %s: %w", path, wait, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
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
