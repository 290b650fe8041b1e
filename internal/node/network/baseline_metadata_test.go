package network

import (
	"net/netip"
	"testing"
)

// cloud stands for the network behind the node: a namespace the node
// routes to through the link up0, with an ordinary server and a fake
// metadata service on every address of MetadataAddresses the test uses.
// Nothing leaves the test's namespaces.
func (n *testNet) cloud(t *testing.T, metadata []string) string {
	t.Helper()
	ns := testNetNS(t)
	run(t, "ip", "-n", n.host, "link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns", ns)
	run(t, "ip", "-n", n.host, "addr", "add", "192.168.200.1/24", "dev", "up0")
	run(t, "ip", "-n", n.host, "link", "set", "up0", "up")
	run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	run(t, "ip", "-n", ns, "addr", "add", "192.168.200.2/24", "dev", "eth0")
	run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
	run(t, "ip", "-n", ns, "route", "add", n.network.String(), "via", "192.168.200.1")
	serveTCP(t, ns, "192.168.200.2:80")
	for _, addr := range metadata {
		run(t, "ip", "-n", ns, "addr", "add", addr+"/32", "dev", "eth0")
		run(t, "ip", "-n", n.host, "route", "add", addr+"/32", "via", "192.168.200.2")
		serveTCP(t, ns, addr+":80")
	}
	return ns
}

// Every guest is kept from the cloud metadata addresses through its node,
// whatever its policy says, unless its agent allows them; DNS to a
// nameserver among them still passes.
func TestBaselineKeepsGuestsFromMetadata(t *testing.T) {
	n := newTestNet(t, "node-1")
	open := n.agentWith(t, &Baseline{Node: "node-2", AllowMetadata: true})
	resolving := n.agentWith(t, &Baseline{Node: "node-3", Nameserver: netip.MustParseAddr("169.254.169.254")})
	run(t, "ip", "netns", "exec", n.host, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	metadata := []string{"169.254.169.254", "100.100.100.200", "168.63.129.16", "192.0.0.192"}
	cloud := n.cloud(t, metadata)
	serveTCP(t, cloud, "169.254.169.254:53")

	denied := n.guest(t, n.baseline, "node-1", "team-a", "denied", "10.88.1.2")
	allowed := n.guest(t, open, "node-2", "team-a", "allowed", "10.88.2.2")
	resolver := n.guest(t, resolving, "node-3", "team-a", "resolver", "10.88.3.2")

	// The path through the node works for all three.
	for _, g := range []*testGuest{denied, allowed, resolver} {
		mustReach(t, g, "192.168.200.2:80")
	}
	for _, addr := range metadata {
		mustReach(t, allowed, addr+":80")
		mustNotReach(t, denied.netns, "a guest", addr+":80")
	}
	mustReach(t, resolver, "169.254.169.254:53")
	mustNotReach(t, resolver.netns, "a guest whose nameserver is the metadata server", "169.254.169.254:80")
	mustNotReach(t, resolver.netns, "a guest whose nameserver is the metadata server", "100.100.100.200:80")

	// A policy that accepts everything (its hook comes after the
	// metadata rules) opens nothing.
	run(t, "ip", "netns", "exec", n.host, "nft", "add", "rule", "bridge", BaselineTable, "p_"+denied.Tap, "accept")
	mustNotReach(t, denied.netns, "a guest whose policy accepts everything", "169.254.169.254:80")

	// Each agent finds the rules it wrote as it wrote them.
	for _, b := range []*Baseline{n.baseline, open, resolving} {
		if repaired, err := b.Repair(); err != nil || repaired {
			t.Errorf("Repair of %s's intact baseline: %v, %v", b.Node, repaired, err)
		}
	}
}
