package network

import (
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/zyvor/kairon/internal/testenv"
)

// crossNodeHost is one node of a two-node test: its namespace with a
// bridge, the baseline and the cross-node routes.
type crossNodeHost struct {
	*testNet
	name   string
	subnet netip.Prefix
	addr   netip.Addr
	routes *CrossNode
}

// crossNodePair makes nodes a (subnet 10.88.1.0/24) and b (10.88.2.0/24),
// on one link (host mode) or on two links joined by a router namespace
// (vxlan mode), and routes each to the other's guests.
func crossNodePair(t *testing.T, mode CrossNodeMode) (a, b *crossNodeHost) {
	t.Helper()
	a = &crossNodeHost{testNet: newTestNet(t, "node-a"), name: "node-a", subnet: netip.MustParsePrefix("10.88.1.0/24")}
	b = &crossNodeHost{testNet: newTestNet(t, "node-b"), name: "node-b", subnet: netip.MustParsePrefix("10.88.2.0/24")}
	if mode == CrossNodeHost {
		a.addr, b.addr = netip.MustParseAddr("192.168.77.1"), netip.MustParseAddr("192.168.77.2")
		run(t, "ip", "-n", a.host, "link", "add", "up0", "type", "veth", "peer", "name", "up0", "netns", b.host)
		for _, h := range []*crossNodeHost{a, b} {
			run(t, "ip", "-n", h.host, "addr", "add", h.addr.String()+"/24", "dev", "up0")
			run(t, "ip", "-n", h.host, "link", "set", "up0", "up")
		}
	} else {
		a.addr, b.addr = netip.MustParseAddr("192.168.71.2"), netip.MustParseAddr("192.168.72.2")
		router := testNetNS(t)
		run(t, "ip", "netns", "exec", router, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
		for i, h := range []*crossNodeHost{a, b} {
			side := []string{"ra", "rb"}[i]
			net := []string{"192.168.71", "192.168.72"}[i]
			other := []string{"192.168.72.0/24", "192.168.71.0/24"}[i]
			run(t, "ip", "-n", h.host, "link", "add", "up0", "type", "veth", "peer", "name", side, "netns", router)
			run(t, "ip", "-n", h.host, "addr", "add", h.addr.String()+"/24", "dev", "up0")
			run(t, "ip", "-n", h.host, "link", "set", "up0", "up")
			run(t, "ip", "-n", h.host, "route", "add", other, "via", net+".1")
			run(t, "ip", "-n", router, "addr", "add", net+".1/24", "dev", side)
			run(t, "ip", "-n", router, "link", "set", side, "up")
		}
	}
	for _, h := range []*crossNodeHost{a, b} {
		h.routes = &CrossNode{NetNS: h.host, Bridge: h.bridge, Node: h.name, Local: h.addr, Mode: mode, VNI: 4242, Port: 4789}
		if err := h.routes.Setup(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := h.routes.Teardown(); err != nil {
				t.Error(err)
			}
		})
	}
	return a, b
}

func (h *crossNodeHost) peer() Peer { return Peer{Node: h.name, Subnet: h.subnet, Address: h.addr} }

// sync gives both nodes the same view: the two peers, moved guests, and
// the addresses of every guest by namespace.
func syncBoth(t *testing.T, a, b *crossNodeHost, moved []MovedGuest, byNamespace map[string][]netip.Addr) {
	t.Helper()
	for _, h := range []*crossNodeHost{a, b} {
		if err := h.routes.Sync([]Peer{a.peer(), b.peer()}, moved); err != nil {
			t.Fatal(err)
		}
		if err := h.baseline.SetNamespaceAddresses(byNamespace); err != nil {
			t.Fatal(err)
		}
	}
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func TestCrossNodeHostRoutes(t *testing.T) { testCrossNode(t, CrossNodeHost) }

func TestCrossNodeVXLAN(t *testing.T) { testCrossNode(t, CrossNodeVXLAN) }

// testCrossNode: a guest reaches a guest of its namespace on the other
// node by address, not one of another namespace (until the addresses say
// it is of that namespace); a guest moved to the other node is reached at
// its address by a guest of its old node; and Sync and Teardown leave no
// route or device behind.
func testCrossNode(t *testing.T, mode CrossNodeMode) {
	a, b := crossNodePair(t, mode)
	if mode == CrossNodeVXLAN {
		if out, err := a.routes.output("ip", "link", "show", "dev", VXLANDevice); err != nil || !strings.Contains(out, "mtu 1450 ") {
			t.Errorf("%s: %v\n%s; want mtu 1450", VXLANDevice, err, out)
		}
	}
	a1 := a.guest(t, a.baseline, a.name, "team-a", "one", "10.88.1.2")
	b1 := b.guest(t, b.baseline, b.name, "team-a", "two", "10.88.2.2")
	b2 := b.guest(t, b.baseline, b.name, "team-b", "three", "10.88.2.3")
	for _, g := range []*testGuest{a1, b1, b2} {
		serveTCP(t, g.netns, g.IP.String()+":8080")
	}
	byNamespace := map[string][]netip.Addr{"team-a": addrs("10.88.1.2", "10.88.2.2"), "team-b": addrs("10.88.2.3")}
	syncBoth(t, a, b, nil, byNamespace)

	mustReach(t, a1, "10.88.2.2:8080")
	mustReach(t, b1, "10.88.1.2:8080")
	mustNotReach(t, a1.netns, "a guest of team-a on node-a", "10.88.2.3:8080")
	// The drop is the namespace's, not the network's: with each listed in
	// the other's namespace (both ways: the answer is routed onto a1's tap),
	// the same guests get through.
	syncBoth(t, a, b, nil, map[string][]netip.Addr{"team-a": addrs("10.88.1.2", "10.88.2.2", "10.88.2.3"), "team-b": addrs("10.88.2.3", "10.88.1.2")})
	mustReach(t, a1, "10.88.2.3:8080")
	syncBoth(t, a, b, nil, byNamespace)
	mustNotReach(t, a1.netns, "a guest of team-a on node-a, no longer in team-b's addresses", "10.88.2.3:8080")

	// A guest of node-b's subnet moves to node-a (it migrated): a host
	// route for its address on both nodes, and node-b tells b1, which
	// cached the guest's MAC, to send to node-b instead.
	byNamespace["team-a"] = append(byNamespace["team-a"], netip.MustParseAddr("10.88.2.9"))
	before := b.guest(t, b.baseline, b.name, "team-a", "moved", "10.88.2.9")
	serveTCP(t, before.netns, "10.88.2.9:8080")
	syncBoth(t, a, b, nil, byNamespace)
	mustReach(t, b1, "10.88.2.9:8080")
	if out := neighbour(t, b1, "10.88.2.9"); !strings.Contains(out, before.MAC) {
		t.Fatalf("b1 has not cached the guest's MAC %s:\n%s", before.MAC, out)
	}
	run(t, "ip", "-n", b.host, "link", "del", before.Tap)
	if err := b.baseline.Remove(before.Tap, "team-a"); err != nil {
		t.Fatal(err)
	}
	moved := a.guest(t, a.baseline, a.name, "team-a", "moved", "10.88.2.9")
	serveTCP(t, moved.netns, "10.88.2.9:8080")
	syncBoth(t, a, b, []MovedGuest{{Address: netip.MustParseAddr("10.88.2.9"), Node: a.name}}, byNamespace)
	testenv.Eventually(t, waitTimeout, "b1 sending to node-b for the moved guest", func() (bool, string) {
		out := neighbour(t, b1, "10.88.2.9")
		return strings.Contains(out, BridgeMAC(b.bridge)), out
	})
	mustReach(t, b1, "10.88.2.9:8080")
	mustReach(t, moved, "10.88.2.2:8080")
	mustReach(t, a1, "10.88.2.9:8080")
	if out := routesOf(t, b); !strings.Contains(out, "10.88.2.9") {
		t.Errorf("node-b has no host route for the moved guest:\n%s", out)
	}

	// Nothing left once the peers and the moved guest are gone.
	for _, h := range []*crossNodeHost{a, b} {
		if err := h.routes.Sync(nil, nil); err != nil {
			t.Fatal(err)
		}
		if out := routesOf(t, h); strings.TrimSpace(out) != "" {
			t.Errorf("%s: routes left after Sync(nil, nil):\n%s", h.name, out)
		}
	}
	mustNotReach(t, a1.netns, "a guest with no route to node-b", "10.88.2.2:8080")
	for _, h := range []*crossNodeHost{a, b} {
		if err := h.routes.Teardown(); err != nil {
			t.Fatal(err)
		}
		if out, err := h.routes.output("ip", "link", "show", "dev", VXLANDevice); err == nil {
			t.Errorf("%s: %s left after Teardown:\n%s", h.name, VXLANDevice, out)
		}
	}
}

// neighbour is g's neighbour entry for addr.
func neighbour(t *testing.T, g *testGuest, addr string) string {
	t.Helper()
	out, err := exec.Command("ip", "-n", g.netns, "neigh", "show", addr).CombinedOutput()
	if err != nil {
		t.Fatalf("ip neigh: %v: %s", err, out)
	}
	return string(out)
}

func routesOf(t *testing.T, h *crossNodeHost) string {
	t.Helper()
	out, err := h.routes.output("ip", "-4", "route", "show", "proto", "75")
	if err != nil {
		t.Fatal(err)
	}
	return out
}
