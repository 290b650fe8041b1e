// Package guestsim is a sim backend whose VMs have a guest agent: each
// Machine's agent socket is served in-process by the real guest agent
// (internal/guestagent/agent), which runs commands and files on this host.
// With it, kairon-node's exec, cp and console attach are tested against a
// real API server without QEMU. Tests only; all of it is in guestsim.go.
package guestsim
