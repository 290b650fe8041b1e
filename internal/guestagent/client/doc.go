// Package client is the host's side of the guest agent protocol
// (docs/design/guest-agent.md): it dials a VM's agent socket, says Hello and
// runs sessions (exec, file read and write, ping, configure) on it, many at
// once, each on its own stream. client.go holds the Client and its reader;
// session.go one session, its buffer and its result.
//
// The guest is untrusted. Everything it sends is read by one goroutine that
// never blocks on a session: output goes into a per-stream buffer no larger
// than the window this side granted (wire.InitialWindow), and is granted
// again only as the caller's writer takes it. A frame the reader refuses,
// data past a window, a message out of place or a write to the guest that
// does not finish within WriteTimeout closes the channel and fails every
// session on it; nothing the guest sends can make the host allocate without
// bound, crash or wait forever.
package client
