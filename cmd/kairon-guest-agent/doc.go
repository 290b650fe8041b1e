// Command kairon-guest-agent runs in a Kairon guest, started by its init.
// It serves the guest agent protocol (docs/design/guest-agent.md, package
// internal/guestagent/agent) on the virtio-serial port named kairon.agent:
// kairon-node runs commands, copies files, pings and configures the guest
// through it, with no guest network.
//
// Built static (CGO_ENABLED=0); the guest's initramfs has no udev, so the
// port is found by name under /sys/class/virtio-ports (main.go).
package main
