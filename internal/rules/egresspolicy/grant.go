package egresspolicy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
)

// Grant is what one MachineNetworkPolicy allows. Grants are kept apart,
// not merged field by field: a policy allowing 10.0.0.0/8 on port 443 and
// another allowing pkg.test on port 80 must not allow 10.0.0.0/8 on 80.
type Grant struct {
	// Nets are allowAddresses, masked, sorted, overlapping ones kept.
	Nets []netip.Prefix
	// FQDNs are the names whose resolved addresses this grant allows.
	FQDNs []Pattern
	// Ports are the allowed destination ports for TCP and UDP; none means
	// every port (and every protocol but ICMP).
	Ports []PortRange
	// SNI, when not empty, restricts TCP to connections opening with a
	// TLS ClientHello naming one of these.
	SNI []Pattern
	// ICMP allows ICMP and ICMPv6 echo requests to Nets and the FQDNs'
	// addresses.
	ICMP bool
}

// ID names the grant's learned-address sets. It depends on the grant's
// content only, so an unchanged grant keeps its learned addresses when the
// Machine's other policies change or the agent restarts.
func (g Grant) ID() string {
	h := sha256.New()
	fmt.Fprintf(h, "%v|%v|%v|%v|%v", g.Nets, g.FQDNs, g.Ports, g.SNI, g.ICMP)
	return hex.EncodeToString(h.Sum(nil))[:10]
}

// AllowsPort tells whether the grant allows TCP or UDP to port.
func (g Grant) AllowsPort(port uint16) bool {
	return g.AllowsPorts(PortRange{port, port})
}

// AllowsPorts tells whether the grant allows TCP or UDP to every port of
// r. The grant's ranges are merged (Allowlist.Grant), so r is allowed
// exactly when one of them holds it whole.
func (g Grant) AllowsPorts(r PortRange) bool {
	if len(g.Ports) == 0 {
		return true
	}
	return slices.ContainsFunc(g.Ports, func(p PortRange) bool { return p.Lo <= r.Lo && r.Hi <= p.Hi })
}

// AllowsNet tells whether every address of n is in one of the grant's
// networks, of the same family: an IPv4 network is never inside an IPv6
// one, as nft keeps the two in separate sets.
func (g Grant) AllowsNet(n netip.Prefix) bool {
	n = n.Masked()
	return slices.ContainsFunc(g.Nets, func(p netip.Prefix) bool {
		return p.Addr().Is4() == n.Addr().Is4() && p.Bits() <= n.Bits() && p.Contains(n.Addr())
	})
}
