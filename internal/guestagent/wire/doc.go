// Package wire is the guest agent's protocol on its virtio channel: frames
// (frame.go: types, Reader, writing), and the messages they carry
// (messages.go) (docs/design/guest-agent.md). kairon-node and
// kairon-guest-agent both speak it; kairon-node reads what a guest wrote, so
// every read here is bounded and refuses what it does not understand instead
// of guessing.
package wire
