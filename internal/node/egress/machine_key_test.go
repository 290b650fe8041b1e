package egress

import (
	"net/netip"
	"strings"
	"testing"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/node/network"
)

// sharedAddress is two agents on one bridge and one table (kairon-local),
// each confining a guest of its own at the same address: what a fault in
// address allocation elsewhere once produced. Guest a may reach only
// pkgAddr:8050, guest b only otherAddr:8050.
type sharedAddress struct {
	n      *testNode
	a, b   *testGuest
	ea, eb *Enforcer
}

func newSharedAddress(t *testing.T) *sharedAddress {
	t.Helper()
	n := newTestNode(t)
	x := &sharedAddress{n: n, ea: n.enforcer, eb: n.newEnforcer(t)}
	x.a = n.guest(t, "team-a", "vm", "10.88.1.2")
	x.b = n.guest(t, "team-b", "vm", "10.88.1.2")
	serveTCP(t, n.outside, pkgAddr+":8050")
	serveTCP(t, n.outside, otherAddr+":8050")
	if err := x.ea.Apply(x.a.Machine, mustCompile(t, kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{pkgAddr + "/32"}, AllowPorts: []kaironv1.PortRange{"8050"}})); err != nil {
		t.Fatal(err)
	}
	if err := x.eb.Apply(x.b.Machine, mustCompile(t, kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{otherAddr + "/32"}, AllowPorts: []kaironv1.PortRange{"8050"}})); err != nil {
		t.Fatal(err)
	}
	return x
}

// answersTo has the node send what it routes to the shared address to g
// alone (a permanent neighbour entry): with two guests answering ARP for
// it, the answers of a connection would otherwise go to either.
func (x *sharedAddress) answersTo(t *testing.T, g *testGuest) {
	t.Helper()
	run(t, "ip", "-n", x.n.host, "neigh", "replace", g.IP.String(), "lladdr", g.MAC, "dev", x.n.bridge, "nud", "permanent")
}

// egress4 is what the node's egress4 map holds, as nft lists it.
func (x *sharedAddress) egress4(t *testing.T) string {
	t.Helper()
	return run(t, "ip", "netns", "exec", x.n.host, "nft", "list", "map", "inet", Table, "egress4")
}

// mustHoldOwnEntries checks that each guest's key goes to its own chain.
func (x *sharedAddress) mustHoldOwnEntries(t *testing.T) {
	t.Helper()
	m := x.egress4(t)
	for _, g := range []*testGuest{x.a, x.b} {
		if want := keyText(g.Machine) + " : goto e_" + g.Tap; !strings.Contains(m, want) {
			t.Fatalf("egress4 lacks %q:\n%s", want, m)
		}
	}
}

// mustKeepOwnPolicies sends real connections from both guests: each is
// held to its own policy.
func (x *sharedAddress) mustKeepOwnPolicies(t *testing.T) {
	t.Helper()
	x.answersTo(t, x.a)
	mustReach(t, x.a, pkgAddr+":8050")
	mustNotReach(t, x.a, otherAddr+":8050")
	x.answersTo(t, x.b)
	mustReach(t, x.b, otherAddr+":8050")
	mustNotReach(t, x.b, pkgAddr+":8050")
}

// TestSharedAddressKeepsEachPolicy: two agents confine two guests with
// the same address; keyed by address alone, the second agent's entry
// replaced the first's, and guest a went out under b's policy.
func TestSharedAddressKeepsEachPolicy(t *testing.T) {
	x := newSharedAddress(t)
	x.mustHoldOwnEntries(t)
	x.mustKeepOwnPolicies(t)
	for _, e := range []*Enforcer{x.ea, x.eb} {
		if repaired, err := e.Repair(); err != nil || repaired {
			t.Fatalf("Repair of intact rules = %v, %v", repaired, err)
		}
	}

	// One agent's removal leaves the other's entry.
	if err := x.eb.Remove(x.b.Tap); err != nil {
		t.Fatal(err)
	}
	if m := x.egress4(t); !strings.Contains(m, keyText(x.a.Machine)+" : goto e_"+x.a.Tap) || strings.Contains(m, x.b.MAC) {
		t.Fatalf("after b's removal egress4 holds:\n%s", m)
	}
	if repaired, err := x.ea.Repair(); err != nil || repaired {
		t.Fatalf("a's Repair after b's removal = %v, %v", repaired, err)
	}
	x.answersTo(t, x.a)
	mustNotReach(t, x.a, otherAddr+":8050")
}

// TestRepairRestoresOwnEntry: another writer deletes or overwrites one
// agent's egress4 entry; that agent's next Repair (one Keep tick) reports
// it and writes it back, and the other agent's sees nothing to do.
func TestRepairRestoresOwnEntry(t *testing.T) {
	x := newSharedAddress(t)
	key := keyText(x.a.Machine)
	map4 := "inet " + Table + " egress4"
	repairedOnce := func(step string) {
		t.Helper()
		if repaired, err := x.ea.Repair(); err != nil || !repaired {
			t.Fatalf("%s: a's Repair = %v, %v; want it to write the entry back", step, repaired, err)
		}
		if repaired, err := x.eb.Repair(); err != nil || repaired {
			t.Fatalf("%s: b's Repair = %v, %v; b's entry was not touched", step, repaired, err)
		}
		x.mustHoldOwnEntries(t)
		if repaired, err := x.ea.Repair(); err != nil || repaired {
			t.Fatalf("%s: a's second Repair = %v, %v", step, repaired, err)
		}
	}

	nftScript(t, x.n.host, "delete element "+map4+" { "+key+" }\n")
	repairedOnce("deleted")

	// Pointed at the other guest's chain: a goes out under b's policy
	// until the repair.
	nftScript(t, x.n.host, "delete element "+map4+" { "+key+" }\nadd element "+map4+" { "+key+" : goto e_"+x.b.Tap+" }\n")
	x.answersTo(t, x.a)
	mustReach(t, x.a, otherAddr+":8050")
	repairedOnce("pointed at b's chain")
	mustNotReach(t, x.a, otherAddr+":8050")

	nftScript(t, x.n.host, "delete element "+map4+" { "+key+" }\nadd element "+map4+" { "+key+" : accept }\n")
	repairedOnce("accepted")
	x.mustKeepOwnPolicies(t)
}

// TestLookupRefusesSharedAddress: the proxies know a guest by its address
// alone; when two of the agent's Machines have one, Lookup names neither.
func TestLookupRefusesSharedAddress(t *testing.T) {
	ns := testNetNS(t)
	t.Cleanup(func() { _ = RemoveTables(ns) })
	e := &Enforcer{NetNS: ns, Bridge: "kbr0", Network: netip.MustParsePrefix("10.88.0.0/16"), Gateway: netip.MustParseAddr("10.88.0.1"), DNSPort: 5353}
	if err := e.Setup(); err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr("10.88.1.2")
	a := Machine{Namespace: "team-a", Name: "vm", Tap: "kta", MAC: macOf("team-a", "vm"), IP: ip}
	b := Machine{Namespace: "team-b", Name: "vm", Tap: "ktb", MAC: macOf("team-b", "vm"), IP: ip}
	p := mustCompile(t, kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pkg.test"}})
	if err := e.Apply(a, p); err != nil {
		t.Fatal(err)
	}
	if m, _, ok := e.Lookup(ip); !ok || m != a {
		t.Fatalf("Lookup with one Machine = %+v, %v", m, ok)
	}
	if err := e.Apply(b, p); err != nil {
		t.Fatal(err)
	}
	if m, _, ok := e.Lookup(ip); ok {
		t.Fatalf("Lookup of an address two Machines share answered %+v", m)
	}
	if err := e.Learn(ip, "pkg.test", []netip.Addr{netip.MustParseAddr(pkgAddr)}, 0); err == nil {
		t.Fatal("Learn for an address two Machines share chose one")
	}
	if err := e.Remove(a.Tap); err != nil {
		t.Fatal(err)
	}
	if m, _, ok := e.Lookup(ip); !ok || m != b {
		t.Fatalf("Lookup after the other's removal = %+v, %v", m, ok)
	}
	// A Machine whose address changes leaves the old one.
	moved := b
	moved.IP = netip.MustParseAddr("10.88.1.3")
	if err := e.Apply(moved, p); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := e.Lookup(ip); ok {
		t.Fatal("Lookup still finds the Machine at its old address")
	}
	if m, _, ok := e.Lookup(moved.IP); !ok || m != moved {
		t.Fatalf("Lookup at the new address = %+v, %v", m, ok)
	}
	if rs := listing(t, ns); strings.Contains(rs, keyText(b)) {
		t.Fatalf("entries of the old address are left:\n%s", rs)
	}
}

// TestSetupReplacesAddressKeyedMaps: the tables of an agent from before
// Machine keys hold egress4, dns_<port> and sni_<port> keyed by address;
// Setup replaces them in its transaction, and Repair brings back the
// entries they held.
func TestSetupReplacesAddressKeyedMaps(t *testing.T) {
	ns := testNetNS(t)
	t.Cleanup(func() { _ = RemoveTables(ns) })
	i := "inet " + Table
	nftScript(t, ns, strings.Join([]string{
		"add table " + i,
		"add map " + i + " egress4 { type ipv4_addr : verdict; }",
		"add chain " + i + " forward { type filter hook forward priority 10; policy accept; }",
		"add rule " + i + " forward ip saddr vmap @egress4",
		"add set " + i + " dns_5353 { type ipv4_addr; }",
		"add chain " + i + " dns_5353 { type nat hook prerouting priority -110; policy accept; }",
		"add rule " + i + " dns_5353 ip saddr @dns_5353 meta l4proto { tcp, udp } th dport 53 redirect to :5353",
		"add map " + i + " sni_5354 { type ipv4_addr : verdict; }",
		"add chain " + i + " sni_5354 { type nat hook prerouting priority -110; policy accept; }",
		"add rule " + i + " sni_5354 meta l4proto tcp ip saddr vmap @sni_5354",
		"add chain " + i + " e_kta",
		"add element " + i + " egress4 { 10.88.1.2 : goto e_kta }",
		"add element " + i + " dns_5353 { 10.88.1.2 }",
	}, "\n")+"\n")
	e := &Enforcer{NetNS: ns, Bridge: "kbr0", Network: netip.MustParsePrefix("10.88.0.0/16"), Gateway: netip.MustParseAddr("10.88.0.1"), DNSPort: 5353, SNIPort: 5354}
	if err := e.Setup(); err != nil {
		t.Fatalf("Setup over address-keyed maps: %v", err)
	}
	rs := listing(t, ns)
	for _, want := range []string{
		"map egress4 {\n\t\ttype ipv4_addr . ether_addr : verdict\n\t}",
		"set dns_5353 {\n\t\ttype ipv4_addr . ether_addr\n\t}",
		"map sni_5354 {\n\t\ttype ipv4_addr . ether_addr : verdict\n\t}",
		"ip saddr . ether saddr vmap @egress4",
		"ip saddr . ether saddr @dns_5353 meta l4proto { tcp, udp } th dport 53 redirect to :5353",
	} {
		if !strings.Contains(rs, want) {
			t.Fatalf("after Setup the table lacks %q:\n%s", want, rs)
		}
	}
	if strings.Contains(rs, "ip saddr vmap") || strings.Contains(rs, "ip saddr @") {
		t.Fatalf("an address-keyed rule is left:\n%s", rs)
	}
	a := Machine{Namespace: "team-a", Name: "vm", Tap: "kta", MAC: network.MAC("team-a_vm"), IP: netip.MustParseAddr("10.88.1.2")}
	if err := e.Apply(a, mustCompile(t, kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{pkgAddr + "/32"}})); err != nil {
		t.Fatal(err)
	}
	if rs := listing(t, ns); !strings.Contains(rs, keyText(a)+" : goto e_kta") {
		t.Fatalf("Apply after the upgrade:\n%s", rs)
	}
	// A second agent's Setup finds them keyed by Machine and keeps them.
	if err := (&Enforcer{NetNS: ns, Bridge: "kbr0", Network: e.Network, Gateway: e.Gateway, DNSPort: 5353, SNIPort: 5354}).Setup(); err != nil {
		t.Fatal(err)
	}
	if repaired, err := e.Repair(); err != nil || repaired {
		t.Fatalf("Repair after another agent's Setup = %v, %v", repaired, err)
	}
}
