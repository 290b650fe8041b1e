package network

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/testenv"
)

// remoteGuest stands for a guest the node reaches by routing, not on its
// bridge (one on another node): a namespace behind a link of its own.
type remoteGuest struct {
	netns string
	ip    netip.Addr
}

// remote adds a guest elsewhere with address ip, routed by the node
// through the link xr<i>; nothing of it is on the bridge.
func (n *testNet) remote(t *testing.T, i int, ip string) *remoteGuest {
	t.Helper()
	r := &remoteGuest{netns: testNetNS(t), ip: netip.MustParseAddr(ip)}
	link := fmt.Sprintf("xr%d", i)
	run(t, "ip", "-n", n.host, "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", r.netns)
	run(t, "ip", "-n", n.host, "link", "set", link, "up")
	run(t, "ip", "-n", n.host, "route", "add", ip+"/32", "dev", link)
	run(t, "ip", "-n", r.netns, "link", "set", "lo", "up")
	run(t, "ip", "-n", r.netns, "addr", "add", ip+"/32", "dev", "eth0")
	run(t, "ip", "-n", r.netns, "link", "set", "eth0", "up")
	// The node answers ARP for its gateway address on any link.
	run(t, "ip", "-n", r.netns, "route", "add", n.gateway.String()+"/32", "dev", "eth0")
	run(t, "ip", "-n", r.netns, "route", "add", n.network.String(), "via", n.gateway.String())
	return r
}

// delivered waits until a datagram from r to addr arrives at got,
// sending again meanwhile (the first waits for the node's ARP).
func delivered(t *testing.T, r *remoteGuest, addr string, got <-chan string) {
	t.Helper()
	payload := "from-" + r.ip.String()
	testenv.Eventually(t, waitTimeout, r.ip.String()+" reaching "+addr, func() (bool, string) {
		if err := sendUDP(r.netns, "", addr, payload); err != nil {
			return false, err.Error()
		}
		for {
			select {
			case m := <-got:
				if m == r.ip.String()+" "+payload {
					return true, ""
				}
			case <-time.After(500 * time.Millisecond):
				return false, "nothing arrived"
			}
		}
	})
	for len(got) > 0 { // the retries' duplicates
		<-got
	}
}

// notDelivered sends datagrams from r to addr and fails if any arrives.
func notDelivered(t *testing.T, r *remoteGuest, addr string, got <-chan string) {
	t.Helper()
	for i := range 5 {
		if err := sendUDP(r.netns, "", addr, fmt.Sprint("blocked-", i)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case m := <-got:
		t.Fatalf("%s reached %s: %q", r.ip, addr, m)
	case <-time.After(blockedWindow):
	}
}

// setElements lists the addresses of set name of the bridge table, sorted.
func setElements(t *testing.T, b *Baseline, name string) []string {
	t.Helper()
	out, err := b.output("list", "set", "bridge", BaselineTable, name)
	if err != nil {
		t.Fatal(err)
	}
	var list []string
	for entry := range objects(out)[name] {
		if _, err := netip.ParseAddr(entry); err == nil {
			list = append(list, entry)
		}
	}
	slices.Sort(list)
	return list
}

// Two agents on one bridge (kairon-local) tell the baseline different
// views of a namespace's addresses: what the node routes onto a tap of
// the namespace may come from an address in either view, whichever agent
// has the tap, and neither agent's write takes out what the other wrote.
func TestBaselineAgentsMergeNamespaceAddresses(t *testing.T) {
	n := newTestNet(t, "node-1")
	node1 := n.baseline
	node2 := n.agent(t, "node-2")
	run(t, "ip", "netns", "exec", n.host, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	a1 := n.guest(t, node1, "node-1", "team-a", "one", "10.88.1.2")
	a2 := n.guest(t, node2, "node-2", "team-a", "two", "10.88.2.2")
	r3 := n.remote(t, 3, "10.88.3.7") // known to node-1
	r4 := n.remote(t, 4, "10.88.4.7") // known to node-2
	r5 := n.remote(t, 5, "10.88.5.7") // a guest of team-b
	at1 := udpReceiver(t, a1.netns, "10.88.1.2:7001")
	at2 := udpReceiver(t, a2.netns, "10.88.2.2:7001")

	if err := node1.SetNamespaceAddresses(map[string][]netip.Addr{"team-a": addrs("10.88.3.7"), "team-b": addrs("10.88.5.7")}); err != nil {
		t.Fatal(err)
	}
	if err := node2.SetNamespaceAddresses(map[string][]netip.Addr{"team-a": addrs("10.88.4.7")}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*remoteGuest{r3, r4} {
		delivered(t, r, "10.88.1.2:7001", at1)
		delivered(t, r, "10.88.2.2:7001", at2)
	}
	notDelivered(t, r5, "10.88.1.2:7001", at1)
	notDelivered(t, r5, "10.88.2.2:7001", at2)

	own1, own2 := ipsSet("team-a", node1.tag()), ipsSet("team-a", node2.tag())
	if own1 == own2 {
		t.Fatalf("both agents write the set %s", own1)
	}
	wantSet := func(b *Baseline, set string, want ...string) {
		t.Helper()
		if got := setElements(t, b, set); !slices.Equal(got, want) {
			t.Errorf("%s holds %v, want %v", set, got, want)
		}
	}
	wantSet(node1, own1, "10.88.1.2", "10.88.3.7")
	wantSet(node2, own2, "10.88.2.2", "10.88.4.7")

	// node-1 learns a new view: node-2's addresses stay.
	if err := node1.SetNamespaceAddresses(map[string][]netip.Addr{"team-a": addrs("10.88.3.8")}); err != nil {
		t.Fatal(err)
	}
	wantSet(node1, own1, "10.88.1.2", "10.88.3.8")
	wantSet(node2, own2, "10.88.2.2", "10.88.4.7")
	delivered(t, r4, "10.88.1.2:7001", at1)
	notDelivered(t, r3, "10.88.1.2:7001", at1)

	// What another writer does to an agent's own set or rule, that
	// agent's next Repair undoes, and only that agent's.
	nft := func(args ...string) { run(t, append([]string{"ip", "netns", "exec", n.host, "nft"}, args...)...) }
	repaired := func(b *Baseline, want bool) {
		t.Helper()
		if got, err := b.Repair(); err != nil || got != want {
			t.Fatalf("Repair of %s: %v, %v; want %v", b.Node, got, err, want)
		}
	}
	nft("add", "element", "bridge", BaselineTable, own1, "{ 10.88.5.7 }")
	repaired(node2, false)
	repaired(node1, true)
	repaired(node1, false)
	wantSet(node1, own1, "10.88.1.2", "10.88.3.8")
	notDelivered(t, r5, "10.88.2.2:7001", at2)

	nft("flush", "set", "bridge", BaselineTable, own2)
	repaired(node1, false)
	repaired(node2, true)
	wantSet(node2, own2, "10.88.2.2", "10.88.4.7")

	handles, err := node1.peersRuleHandles("team-a")
	if err != nil || len(handles) != 1 {
		t.Fatalf("node-1's rules in %s: %v, %v; want one", peersChain("team-a"), handles, err)
	}
	nft("delete", "rule", "bridge", BaselineTable, peersChain("team-a"), "handle", handles[0])
	repaired(node2, false)
	repaired(node1, true)
	// node-1's view reaches node-2's tap again only through node-1's rule.
	if err := node1.SetNamespaceAddresses(map[string][]netip.Addr{"team-a": addrs("10.88.3.7")}); err != nil {
		t.Fatal(err)
	}
	delivered(t, r3, "10.88.2.2:7001", at2)

	// node-1 restarts and pins its tap again: one rule of its own still.
	restarted := n.agent(t, "node-1")
	if err := restarted.Ensure(a1.Guest); err != nil {
		t.Fatal(err)
	}
	if handles, err := restarted.peersRuleHandles("team-a"); err != nil || len(handles) != 1 {
		t.Fatalf("after the restart, node-1's rules in %s: %v, %v; want one", peersChain("team-a"), handles, err)
	}

	// node-1's last guest of team-a goes, and its set and rule with it;
	// node-2's stay for its own tap.
	if err := restarted.Remove(a1.Tap, "team-a"); err != nil {
		t.Fatal(err)
	}
	listing, err := node2.output("list", "table", "bridge", BaselineTable)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(listing, own1) {
		t.Errorf("node-1's set or rule for team-a left after its last tap:\n%s", listing)
	}
	wantSet(node2, own2, "10.88.2.2", "10.88.4.7")
	delivered(t, r4, "10.88.2.2:7001", at2)
	repaired(node2, false)

	// The namespace's last tap takes the shared chain and sets with it.
	if err := node2.Remove(a2.Tap, "team-a"); err != nil {
		t.Fatal(err)
	}
	if listing, _ := node2.output("list", "table", "bridge", BaselineTable); strings.Contains(listing, "team-a") {
		t.Errorf("team-a's objects left after its last tap:\n%s", listing)
	}
}
