package node

import (
	"net/netip"
	"testing"
)

func TestGuestNameserver(t *testing.T) {
	gateway := netip.MustParseAddr("10.88.0.1")
	for _, tc := range []struct {
		name string
		eo   *EgressOptions
		want string
	}{
		{"no egress options", nil, "invalid IP"},
		{"the node's resolver", &EgressOptions{DNSPort: 10053, DNSUpstream: "192.0.2.53:53"}, "192.0.2.53"},
		{"the node's resolver, proxy off", &EgressOptions{DNSUpstream: "192.0.2.53:53"}, "192.0.2.53"},
		{"systemd-resolved's stub", &EgressOptions{DNSPort: 10053, DNSUpstream: "127.0.0.53:53"}, "10.88.0.1"},
		{"another port", &EgressOptions{DNSPort: 10053, DNSUpstream: "192.0.2.53:5353"}, "10.88.0.1"},
		{"IPv6", &EgressOptions{DNSPort: 10053, DNSUpstream: "[2001:db8::53]:53"}, "10.88.0.1"},
		{"IPv4 written as IPv6", &EgressOptions{DNSPort: 10053, DNSUpstream: "[::ffff:192.0.2.53]:53"}, "192.0.2.53"},
		{"a name, not an address", &EgressOptions{DNSPort: 10053, DNSUpstream: "dns.example:53"}, "10.88.0.1"},
		{"unreachable and no proxy", &EgressOptions{DNSUpstream: "127.0.0.53:53"}, "invalid IP"},
		{"auto left unresolved, no proxy", &EgressOptions{DNSUpstream: "auto"}, "invalid IP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := guestNameserver(tc.eo, gateway).String(); got != tc.want {
				t.Errorf("guestNameserver = %s, want %s", got, tc.want)
			}
		})
	}
}
