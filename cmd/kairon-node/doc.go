// Command kairon-node is the node agent: it runs the Machines placed on its
// Node as VMs and reports their status. main.go parses flags, picks the
// backend (qemu or sim) and runs internal/node's Agent.
package main
