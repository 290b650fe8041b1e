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
// An image guest (an OCI image the guest booted, internal/imagefs) runs
// everything inside the image's root:
//
//   - image.go: the Image, and a command run in it (chroot, its PATH, user,
//     working directory and environment);
//   - users.go: user[:group] resolved with the image's /etc/passwd and
//     /etc/group;
//   - inroot.go: paths resolved inside the root (openat2 RESOLVE_IN_ROOT),
//     files replaced whole;
//   - imagemount.go: the image's disk mounted at boot, under an overlay
//     whose writable layer is in guest memory;
//   - rootsetup.go, identity.go: the root prepared at boot (proc, sys, dev,
//     run, /tmp) and its /etc/hostname, /etc/hosts and /etc/resolv.conf;
//   - mainproc.go: the image's main process, run once per boot, and its
//     state, which pings report.
//
// The host is trusted here (the guest is the untrusted side), but the agent
// still bounds what it buffers: each data stream has a window (wire.Window),
// so stdin the program does not read stays on the host, and output the host
// does not take stays in the program's pipe. An image is the user's, so
// what it holds (symlinks, account files, its config) is read defensively.
package agent
