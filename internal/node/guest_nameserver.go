package node

import "net/netip"

// guestNameserver is the resolver a guest's /etc/resolv.conf names, as a
// Pod with dnsPolicy Default gets its node's: the node's upstream resolver
// (the one its DNS proxy forwards to), which an unconfined guest reaches
// through the node like any other address. A confined guest's DNS goes to
// the node's DNS proxy whatever address it asks (egress.md), so for it any
// address will do.
//
// Guests have IPv4 only, and a resolv.conf line has no port; an upstream
// the guests could not reach that way (IPv6, another port, a loopback
// address of the node such as systemd-resolved's 127.0.0.53) gives way to
// the gateway while the DNS proxy runs: confined guests still resolve
// there, unconfined ones are refused at once (the node's baseline) rather
// than left to time out. Without either, the guest gets no nameserver.
func guestNameserver(eo *EgressOptions, gateway netip.Addr) netip.Addr {
	if eo == nil {
		return netip.Addr{}
	}
	if up, err := netip.ParseAddrPort(eo.DNSUpstream); err == nil {
		addr := up.Addr().Unmap()
		if up.Port() == 53 && addr.Is4() && !addr.IsLoopback() && !addr.IsUnspecified() && !addr.IsMulticast() {
			return addr
		}
	}
	if eo.DNSPort != 0 {
		return gateway
	}
	return netip.Addr{}
}
