package network

import (
	"fmt"
	"net/netip"
	"strings"
)

// GuestSubnets splits a cluster-wide guest range into one subnet per node,
// as Calico's IPAM blocks and Flannel's node subnets do: a node hands out
// addresses from its own subnet only, so nodes never race for an address,
// and other nodes route the whole subnet to it.
//
// Every node's bridge carries the same gateway, the first address of the
// cluster range, with the whole range as its network (IPAM.Gateway): a
// guest that moves to another node keeps its gateway, and it reaches
// guests of other subnets through the node (proxy ARP on the bridge).
// The subnet holding the gateway is never a node's.
type GuestSubnets struct {
	Cluster netip.Prefix
	Bits    int
}

// NewGuestSubnets checks that cluster can be split into subnets of bits:
// an IPv4 range, subnets smaller than it and large enough for guests.
func NewGuestSubnets(cluster netip.Prefix, bits int) (GuestSubnets, error) {
	cluster = cluster.Masked()
	if !cluster.Addr().Is4() {
		return GuestSubnets{}, fmt.Errorf("--cluster-guest-cidr %s: need an IPv4 range", cluster)
	}
	if bits <= cluster.Bits() || bits > 29 {
		return GuestSubnets{}, fmt.Errorf("--node-guest-prefix %d: must be longer than --cluster-guest-cidr's /%d and at most 29", bits, cluster.Bits())
	}
	if bits-cluster.Bits() > 16 {
		return GuestSubnets{}, fmt.Errorf("--node-guest-prefix %d: more than 65536 node subnets in %s", bits, cluster)
	}
	return GuestSubnets{Cluster: cluster, Bits: bits}, nil
}

// Gateway is the bridges' address: the first of the cluster range, with
// the range's length.
func (s GuestSubnets) Gateway() netip.Prefix {
	return netip.PrefixFrom(s.Cluster.Addr().Next(), s.Cluster.Bits())
}

// Valid tells whether p is one of the node subnets.
func (s GuestSubnets) Valid(p netip.Prefix) bool {
	return p.IsValid() && p == p.Masked() && p.Bits() == s.Bits && s.Cluster.Contains(p.Addr()) && !p.Contains(s.Gateway().Addr())
}

// Candidates yields the node subnets, lowest first.
func (s GuestSubnets) Candidates(yield func(netip.Prefix) bool) {
	size := uint32(1) << (32 - s.Bits)
	count := uint32(1) << (s.Bits - s.Cluster.Bits())
	base := s.Cluster.Addr().As4()
	start := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	for i := uint32(0); i < count; i++ {
		v := start + i*size
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), s.Bits)
		if !s.Valid(p) {
			continue
		}
		if !yield(p) {
			return
		}
	}
}

// SubnetClaimName is the name of the object that claims p for one node
// (a Lease): a DNS-1123 name made of p, so two nodes claiming the same
// subnet create the same object and only the first succeeds.
func SubnetClaimName(p netip.Prefix) string {
	return "kairon-guest-subnet-" + strings.ReplaceAll(p.Addr().String(), ".", "-") + "-" + fmt.Sprint(p.Bits())
}
