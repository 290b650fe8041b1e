// Package agent is kairon-guest-agent's logic: it serves the guest agent
// protocol (docs/design/guest-agent.md, package wire) on one byte stream,
// the virtio-serial port in a guest or a pipe in a test. It runs commands,
// reads and writes files, answers pings and applies configure requests.
//
//   - agent.go: the Agent, its connection and the dispatch of requests;
//   - session.go: one exec or file session, its windows and output;
//   - pty.go: the pseudo-terminal of an interactive exec;
//   - system.go, netconfig.go: configure requests, applied to the guest's
//     interface over netlink (MAC, addresses, default route) and its entropy.
//
// The host is trusted here (the guest is the untrusted side), but the agent
// still bounds what it buffers: each data stream has a window (wire.Window),
// so stdin the program does not read stays on the host, and output the host
// does not take stays in the program's pipe.
package agent
