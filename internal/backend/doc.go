// Package backend is the seam between the node agent and whatever runs a
// Machine's VM (backend.go: the Backend interface and the types it speaks).
// The agent decides what should run; a Backend makes it so and reports what
// runs. Implementations: qemu (default, real VMs) and sim (hollow VMs for
// control-plane scale tests only).
package backend
