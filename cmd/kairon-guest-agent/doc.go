// Command kairon-guest-agent runs in a Kairon guest, started by its init.
// It serves the guest agent protocol (docs/design/guest-agent.md, package
// internal/guestagent/agent) on the virtio-serial port named kairon.agent:
// kairon-node runs commands, copies files, pings and configures the guest
// through it, with no guest network. In an image guest (--root) it does
// all of that inside the image.
//
// Built static (CGO_ENABLED=0); the guest's initramfs has no udev, so the
// port is found by name under /sys/class/virtio-ports.
//
//   - main.go: serving the port;
//   - image.go: the subcommands an image guest's init runs once per boot,
//     prepare-root (the image's root made ready) and main (the image's main
//     process).
package main
