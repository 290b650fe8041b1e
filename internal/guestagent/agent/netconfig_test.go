package agent

import (
	"strings"
	"testing"

	"github.com/zyvor/kairon/internal/guestagent/wire"
	"github.com/zyvor/kairon/internal/testenv/netlab"
)

// A guest's interface as a clone of a saved guest finds it (the template's
// address, a second one in its subnet, an IPv6 one, the template's default
// route), in a namespace the test creates, configured through rtnetlink as
// the agent does in a guest.
func TestConfigureLink(t *testing.T) {
	ns := netlab.Namespace(t, "kga")
	netlab.Run(t, "ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")
	netlab.Run(t, "ip", "-n", ns, "link", "set", "peer0", "up")
	netlab.Run(t, "ip", "-n", ns, "addr", "add", "10.88.0.5/24", "dev", "eth0")
	netlab.Run(t, "ip", "-n", ns, "addr", "add", "10.88.0.6/24", "dev", "eth0")
	netlab.Run(t, "ip", "-n", ns, "addr", "add", "fd00::5/64", "dev", "eth0", "nodad")
	netlab.Run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
	netlab.Run(t, "ip", "-n", ns, "route", "add", "default", "via", "10.88.0.1", "dev", "eth0")

	configure := func(c *wire.Configure) error {
		return netlab.In(ns, func() error { return configureLink("eth0", c) })
	}
	show := func() (link, addrs, routes string) {
		return netlab.Run(t, "ip", "-n", ns, "-o", "link", "show", "dev", "eth0"),
			netlab.Run(t, "ip", "-n", ns, "-o", "addr", "show", "dev", "eth0", "scope", "global"),
			netlab.Run(t, "ip", "-n", ns, "route", "show", "default")
	}
	clone := &wire.Configure{MAC: "52:54:00:aa:bb:cc", Addresses: []string{"10.88.0.9/24", "fd00::9/64"}, Gateway: "10.88.0.1"}
	// Twice: a host that sends its configure again gets the same guest.
	for i := range 2 {
		if err := configure(clone); err != nil {
			t.Fatalf("configure #%d: %v", i+1, err)
		}
		link, addrs, routes := show()
		if !strings.Contains(link, "link/ether 52:54:00:aa:bb:cc") || !strings.Contains(link, ",UP") {
			t.Errorf("configure #%d: link %s", i+1, link)
		}
		if !strings.Contains(addrs, "inet 10.88.0.9/24") || !strings.Contains(addrs, "inet6 fd00::9/64") ||
			strings.Contains(addrs, "10.88.0.5") || strings.Contains(addrs, "10.88.0.6") || strings.Contains(addrs, "fd00::5/") {
			t.Errorf("configure #%d: addresses\n%s", i+1, addrs)
		}
		if strings.TrimSpace(routes) != "default via 10.88.0.1 dev eth0" {
			t.Errorf("configure #%d: default route %q", i+1, routes)
		}
	}

	// A new gateway replaces the default route.
	netlab.Run(t, "ip", "-n", ns, "addr", "add", "10.99.0.9/24", "dev", "eth0")
	if err := configure(&wire.Configure{Gateway: "10.99.0.1"}); err != nil {
		t.Fatal(err)
	}
	if _, _, routes := show(); strings.TrimSpace(routes) != "default via 10.99.0.1 dev eth0" {
		t.Errorf("after a new gateway: default route %q", routes)
	}

	// Bad values name their field and change nothing of what follows them.
	_, before, _ := show()
	for _, tc := range []struct {
		c    *wire.Configure
		want string
	}{
		{&wire.Configure{Addresses: []string{"10.88.0.10/24", "bogus"}}, "addresses[1]"},
		{&wire.Configure{MAC: "not-a-mac"}, "mac"},
		{&wire.Configure{Gateway: "10.77.0.1"}, "gateway"}, // on no subnet of eth0
	} {
		err := configure(tc.c)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("configure %+v: %v, want an error naming %s", tc.c, err, tc.want)
		}
		if _, after, _ := show(); after != before {
			t.Errorf("configure %+v changed the addresses:\n%s\nto\n%s", tc.c, before, after)
		}
	}
	if err := netlab.In(ns, func() error { return configureLink("eth9", clone) }); err == nil || !strings.Contains(err.Error(), "eth9") {
		t.Errorf("configure of a missing interface: %v", err)
	}
}
