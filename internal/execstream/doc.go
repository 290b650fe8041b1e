// Package execstream is the stream between a client (kaironctl) and
// kairon-node for exec, file copy and console attach
// (docs/design/guest-agent.md, "From the client to the node"): an HTTP/1.1
// request with Upgrade: kairon-exec.v1, answered 101 Switching Protocols,
// after which both sides exchange the guest agent's frames (package wire)
// on one stream, StreamID:
//
//   - client to node: Stdin data, Close{"stdin"}, Resize, Cancel;
//   - node to client: Stdout and Stderr data, then one Exit, and the node
//     closes the connection.
//
// Both sides read with wire.Reader, so every frame is bounded (64 KiB of
// data, 16 KiB of JSON) and strictly decoded. There is no Window here: the
// connection is TCP, whose own flow control holds a side that writes
// faster than the other reads, and neither side buffers more than a frame.
// All of it is in execstream.go.
package execstream
