// Package network gives each Machine on a node its place on the node's
// network. The node agent owns all of it so that it can filter a Machine's
// traffic at its tap.
//
//   - ipam.go: an address from the node's range, kept across restarts;
//   - subnets.go: the guest subnets a node may take, and the claim that
//     reserves one cluster-wide;
//   - links.go: the node's bridge and each Machine's tap;
//   - baseline.go: the baseline rules every guest gets (no spoofing, the
//     metadata and peer rules) before any egress policy;
//   - crossnode.go, announce.go: guests reachable across nodes (VXLAN
//     routes to the peers' subnets, and the gateway announced again after a
//     guest moved);
//   - netns.go: running a function inside a network namespace.
package network
