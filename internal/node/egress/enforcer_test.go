package egress

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/node/network"
	"github.com/zyvor/kairon/internal/rules/egresspolicy"
)

func mustCompile(t *testing.T, rules ...kaironv1.EgressRules) *Policy {
	t.Helper()
	var nps []egresspolicy.NamedPolicy
	for i, r := range rules {
		nps = append(nps, egresspolicy.NamedPolicy{Name: string(rune('a' + i)), Egress: r})
	}
	p, err := egresspolicy.Compile(nps)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestMachineScript(t *testing.T) {
	e := &Enforcer{Network: netip.MustParsePrefix("10.88.0.0/16"), Gateway: netip.MustParseAddr("10.88.0.1"), DNSPort: 5353}
	m := Machine{Namespace: "team-a", Name: "vm", Tap: "kt0123456789", MAC: macOf("team-a", "vm"), IP: netip.MustParseAddr("10.88.1.2")}
	p := mustCompile(t,
		kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"203.0.113.0/24", "169.254.169.254/32", "10.88.1.3/32"}, AllowPorts: []kaironv1.PortRange{"8000-8100", "443"}, AllowIcmp: true},
		kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pkg.test"}},
		kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"tls.test"}, AllowSNI: []kaironv1.ServerName{"tls.test"}, AllowPorts: []kaironv1.PortRange{"443"}},
	)
	s := e.machineScript(m, p, []string{"l4_kt0123456789_0000000000"})
	fqdn := learnedSetName(m.Tap, p.Grants[1].ID())
	sni := learnedSetName(m.Tap, p.Grants[2].ID())
	for _, want := range []string{
		// Bridge: only explicit guest-network CIDRs go anywhere but the node.
		"add rule bridge kairon_egress e_kt0123456789 ip daddr { 10.88.1.3/32, 169.254.169.254/32 } accept\n" +
			"add rule bridge kairon_egress e_kt0123456789 ether type arp accept\n" +
			"add rule bridge kairon_egress e_kt0123456789 drop\n",
		"delete set inet kairon_egress l4_kt0123456789_0000000000\n",
		"add set inet kairon_egress " + fqdn + " { type ipv4_addr; size 4096; flags timeout; }\n",
		// Replies first; explicit CIDRs before the always-denied drop, the
		// rest after it; the default drop last.
		"add rule inet kairon_egress e_kt0123456789 ct state established,related accept\n" +
			"add rule inet kairon_egress e_kt0123456789 ip daddr { 10.88.1.3/32, 169.254.169.254/32 } meta l4proto { tcp, udp } th dport { 443, 8000-8100 } accept\n" +
			"add rule inet kairon_egress e_kt0123456789 ip daddr { 10.88.1.3/32, 169.254.169.254/32 } icmp type echo-request accept\n" +
			"add rule inet kairon_egress e_kt0123456789 ip daddr @denied4 add @dd_kt0123456789_ip { ip daddr . meta l4proto . th dport }\n" +
			"add rule inet kairon_egress e_kt0123456789 ip daddr @denied4 counter name \"d_kt0123456789_ip\" drop\n" +
			"add rule inet kairon_egress e_kt0123456789 ip daddr { 203.0.113.0/24 } meta l4proto { tcp, udp } th dport { 443, 8000-8100 } accept\n" +
			"add rule inet kairon_egress e_kt0123456789 ip daddr { 203.0.113.0/24 } icmp type echo-request accept\n",
		"add rule inet kairon_egress e_kt0123456789 ip daddr @" + fqdn + " meta l4proto != { icmp, ipv6-icmp } accept\n",
		// SNI without the proxy: no TCP at all.
		"add rule inet kairon_egress e_kt0123456789 ip daddr @" + sni + " meta l4proto udp th dport { 443 } accept\n",
		"add rule inet kairon_egress e_kt0123456789 meta l4proto { icmp, ipv6-icmp } counter name \"d_kt0123456789_icmp\" drop\n",
		"add rule inet kairon_egress e_kt0123456789 ip daddr @" + fqdn + " add @dd_kt0123456789_port { ip daddr . meta l4proto . th dport }\n" +
			"add rule inet kairon_egress e_kt0123456789 ip daddr @" + fqdn + " counter name \"d_kt0123456789_port\" drop\n",
		// The default drop, recording its destination first.
		"add rule inet kairon_egress e_kt0123456789 meta nfproto ipv4 add @dd_kt0123456789_ip { ip daddr . meta l4proto . th dport }\n" +
			"add rule inet kairon_egress e_kt0123456789 meta nfproto ipv4 counter name \"d_kt0123456789_ip\" drop\n",
		"add set inet kairon_egress dd_kt0123456789_port { type ipv4_addr . inet_proto . inet_service; size 16; flags dynamic,timeout; timeout 60s; }\n",
		"add element bridge kairon_egress egress_vmap { \"kt0123456789\" : goto e_kt0123456789 }\n",
		"add element inet kairon_egress egress4 { " + keyText(m) + " : goto e_kt0123456789 }\n",
		"add element inet kairon_egress dns_5353 { " + keyText(m) + " }\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("script lacks\n%s\nscript:\n%s", want, s)
		}
	}
	if strings.Contains(s, "ip daddr @"+fqdn+" icmp") {
		t.Error("a grant without allowIcmp allows ICMP")
	}
	rm := e.removeScript(m.Tap, keyText(m), m.Tap, []string{fqdn})
	for _, want := range []string{
		"delete element bridge kairon_egress egress_vmap { \"kt0123456789\" }\n",
		"delete chain bridge kairon_egress e_kt0123456789\n",
		"delete element inet kairon_egress egress4 { " + keyText(m) + " }\n",
		"delete element inet kairon_egress dns_5353 { " + keyText(m) + " }\n",
		"delete chain inet kairon_egress e_kt0123456789\n",
		"delete set inet kairon_egress " + fqdn + "\n",
		"delete set inet kairon_egress dd_kt0123456789_icmp\n",
	} {
		if !strings.Contains(rm, want) {
			t.Errorf("remove script lacks\n%s\nscript:\n%s", want, rm)
		}
	}
}

// TestSNIScript: with the SNI proxy, the nat chain redirects TCP that
// only an allowSNI grant allows, lets what another grant allows without a
// name pass to the filter, and follows the filter's order around the
// always-denied ranges.
func TestSNIScript(t *testing.T) {
	e := &Enforcer{Network: netip.MustParsePrefix("10.88.0.0/16"), Gateway: netip.MustParseAddr("10.88.0.1"), SNIPort: 5354}
	m := Machine{Namespace: "team-a", Name: "vm", Tap: "kt0123456789", MAC: macOf("team-a", "vm"), IP: netip.MustParseAddr("10.88.1.2")}
	p := mustCompile(t,
		kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"203.0.113.0/24", "169.254.169.254/32"}, AllowSNI: []kaironv1.ServerName{"*.pkg.test"}, AllowPorts: []kaironv1.PortRange{"443"}},
		kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"203.0.113.7/32"}},
		kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"tls.test"}, AllowSNI: []kaironv1.ServerName{"tls.test"}},
	)
	s := e.machineScript(m, p, nil)
	learned := learnedSetName(m.Tap, p.Grants[2].ID())
	want := "add chain inet kairon_egress s_kt0123456789\n" +
		"flush chain inet kairon_egress s_kt0123456789\n" +
		"add element inet kairon_egress sni_5354 { " + keyText(m) + " : goto s_kt0123456789 }\n" +
		"delete element inet kairon_egress sni_5354 { " + keyText(m) + " }\n" +
		"add rule inet kairon_egress s_kt0123456789 ip daddr { 169.254.169.254/32 } tcp dport { 443 } redirect to :5354\n" +
		"add rule inet kairon_egress s_kt0123456789 ip daddr @denied4 return\n" +
		"add rule inet kairon_egress s_kt0123456789 ip daddr { 203.0.113.7/32 } meta l4proto tcp return\n" +
		"add rule inet kairon_egress s_kt0123456789 ip daddr { 203.0.113.0/24 } tcp dport { 443 } redirect to :5354\n" +
		"add rule inet kairon_egress s_kt0123456789 ip daddr @" + learned + " meta l4proto tcp redirect to :5354\n" +
		"add element inet kairon_egress sni_5354 { " + keyText(m) + " : goto s_kt0123456789 }\n"
	if !strings.Contains(s, want) {
		t.Errorf("script lacks\n%s\nscript:\n%s", want, s)
	}
	for _, c := range []struct {
		dst  string
		want []Pattern
	}{
		{"203.0.113.9:443", []Pattern{"*.pkg.test"}},
		{"203.0.113.9:80", nil},
		{"169.254.169.254:443", []Pattern{"*.pkg.test"}},
		{"198.51.100.1:443", nil},
	} {
		got := e.serverNamesFor(m, p, netip.MustParseAddrPort(c.dst))
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("server names for %s: %v, want %v", c.dst, got, c.want)
		}
	}
	// Without allowSNI, no entry: the Machine's TCP is not redirected.
	plain := e.machineScript(m, mustCompile(t, kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"203.0.113.0/24"}}), nil)
	if strings.Count(plain, "sni_5354 { "+keyText(m)+" : goto") != 1 || !strings.Contains(plain, "delete element inet kairon_egress sni_5354 { "+keyText(m)+" }\n") || strings.Contains(plain, "redirect") {
		t.Errorf("a policy without allowSNI is redirected:\n%s", plain)
	}
	rm := e.removeScript(m.Tap, keyText(m), m.Tap, nil)
	for _, w := range []string{"delete element inet kairon_egress sni_5354 { " + keyText(m) + " }\n", "delete chain inet kairon_egress s_kt0123456789\n"} {
		if !strings.Contains(rm, w) {
			t.Errorf("remove script lacks %q:\n%s", w, rm)
		}
	}
}

func TestEnforcerRefusesWhatIsNotAName(t *testing.T) {
	e := &Enforcer{machines: map[string]*applied{}}
	for _, m := range []Machine{
		{Tap: `kt0" accept`, IP: netip.MustParseAddr("10.88.1.2")},
		{Tap: "kt0123456789abcd", IP: netip.MustParseAddr("10.88.1.2")},
		{Tap: "kt0123456789", IP: netip.MustParseAddr("fe80::1")},
		{Tap: "kt0123456789"},
		{Tap: "kt0123456789", IP: netip.MustParseAddr("10.88.1.2")},
		{Tap: "kt0123456789", MAC: "52:54:00:01:02", IP: netip.MustParseAddr("10.88.1.2")},
		{Tap: "kt0123456789", MAC: "02:00:00:00:00:00:00:01", IP: netip.MustParseAddr("10.88.1.2")},
	} {
		if err := e.Apply(m, &Policy{}); err == nil {
			t.Errorf("Apply(%+v) accepted it", m)
		}
	}
}

func TestTTLClamp(t *testing.T) {
	e := &Enforcer{}
	e.defaults()
	for ttl, want := range map[int]int{0: 35, 29: 35, 300: 305, 7200: 3605} {
		if got := e.TTL(secs(ttl)); got != secs(want) {
			t.Errorf("TTL(%ds) = %v, want %ds", ttl, got, want)
		}
	}
}

// TestEnforcement sends real packets from veth guests through a node
// namespace with the baseline and the egress tables to an outside
// namespace.
func TestEnforcement(t *testing.T) {
	n := newTestNode(t)
	confined := n.guest(t, "team-a", "confined", "10.88.1.2")
	free := n.guest(t, "team-a", "free", "10.88.1.3")
	for _, a := range []string{pkgAddr + ":8050", pkgAddr + ":9000", otherAddr + ":8050", metadataAddr + ":80"} {
		serveTCP(t, n.outside, a)
	}
	serveTCP(t, free.netns, "10.88.1.3:7000")
	serveTCP(t, n.host, uplinkNode+":7100")

	// Unconfined, the guest reaches everything the node routes for it,
	// and its namespace's peer.
	mustReach(t, confined, otherAddr+":8050")
	mustReach(t, confined, "10.88.1.3:7000")
	mustReach(t, confined, metadataAddr+":80")
	if err := ping(confined.netns, pkgAddr); err != nil {
		t.Fatalf("unconfined ping: %v", err)
	}

	policy := kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{pkgAddr + "/32"}, AllowPorts: []kaironv1.PortRange{"8000-8100"}}
	if err := n.enforcer.Apply(confined.Machine, mustCompile(t, policy)); err != nil {
		t.Fatal(err)
	}
	mustReach(t, confined, pkgAddr+":8050")
	t.Run("port outside the range", func(t *testing.T) { mustNotReach(t, confined, pkgAddr+":9000") })
	t.Run("address outside the CIDRs", func(t *testing.T) { mustNotReach(t, confined, otherAddr+":8050") })
	t.Run("metadata", func(t *testing.T) { mustNotReach(t, confined, metadataAddr+":80") })
	t.Run("another guest", func(t *testing.T) { mustNotReach(t, confined, "10.88.1.3:7000") })
	t.Run("the node's uplink address", func(t *testing.T) { mustNotReach(t, confined, uplinkNode+":7100") })
	t.Run("ICMP off", func(t *testing.T) {
		if err := ping(confined.netns, pkgAddr); err == nil {
			t.Fatal("ping passed without allowIcmp")
		}
	})
	t.Run("dropped destinations recorded", func(t *testing.T) {
		ds, err := n.enforcer.DeniedDestinations()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, d := range ds {
			if d.Machine.Name != "confined" || d.Age < 0 || d.Age > recentWindow {
				t.Errorf("unexpected record %+v", d)
			}
			got[d.Reason+" "+d.String()] = true
		}
		for _, want := range []string{"port tcp " + pkgAddr + ":9000", "ip tcp " + otherAddr + ":8050", "ip tcp " + metadataAddr + ":80", "icmp icmp " + pkgAddr} {
			if !got[want] {
				t.Errorf("no record of %q among %v", want, got)
			}
		}
	})
	t.Run("drops counted by reason", func(t *testing.T) {
		ds, err := n.enforcer.DeniedCounts()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]uint64{}
		for _, d := range ds {
			if d.Machine.Name != "confined" {
				t.Errorf("counts of another Machine: %+v", d)
			}
			got[d.Reason] = d.Packets
		}
		// The subtests above: port 9000 (port); another address, the
		// metadata address, another guest, the node (ip); a ping (icmp).
		if got[ReasonPort] == 0 || got[ReasonIP] == 0 || got[ReasonICMP] == 0 {
			t.Fatalf("denied counts %v, want port, ip and icmp drops", got)
		}
	})
	t.Run("unconfined guest", func(t *testing.T) {
		mustReach(t, free, otherAddr+":8050")
		mustReach(t, free, pkgAddr+":9000")
	})

	t.Run("ICMP on, metadata named explicitly", func(t *testing.T) {
		on := policy
		on.AllowIcmp = true
		meta := kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{metadataAddr + "/32"}, AllowPorts: []kaironv1.PortRange{"80"}}
		if err := n.enforcer.Apply(confined.Machine, mustCompile(t, on, meta)); err != nil {
			t.Fatal(err)
		}
		if err := ping(confined.netns, pkgAddr); err != nil {
			t.Fatalf("ping with allowIcmp: %v", err)
		}
		mustReach(t, confined, metadataAddr+":80")
		if err := ping(confined.netns, otherAddr); err == nil {
			t.Fatal("ping to an address no policy allows passed")
		}
		if err := n.enforcer.Apply(confined.Machine, mustCompile(t, policy)); err != nil {
			t.Fatal(err)
		}
		mustNotReach(t, confined, metadataAddr+":80")
	})

	t.Run("agent restart", func(t *testing.T) {
		before := n.ruleset(t)
		// The old agent is gone (its Enforcer dropped), its rules are not.
		mustNotReach(t, confined, otherAddr+":8050")
		restarted := n.newEnforcer(t)
		mustNotReach(t, confined, otherAddr+":8050")
		if err := restarted.Apply(confined.Machine, mustCompile(t, policy)); err != nil {
			t.Fatal(err)
		}
		if after := n.ruleset(t); after != before {
			t.Fatalf("rebuilding changed the ruleset:\nbefore\n%s\nafter\n%s", before, after)
		}
		mustReach(t, confined, pkgAddr+":8050")
		mustNotReach(t, confined, otherAddr+":8050")
		n.enforcer = restarted
	})

	t.Run("ruleset flushed", func(t *testing.T) {
		if repaired, err := n.enforcer.Repair(); err != nil || repaired {
			t.Fatalf("Repair of intact rules = %v, %v", repaired, err)
		}
		run(t, "ip", "netns", "exec", n.host, "nft", "flush", "ruleset")
		if _, err := n.baseline.Repair(); err != nil {
			t.Fatal(err)
		}
		// Without the egress tables the guest is as free as any other.
		mustReach(t, confined, otherAddr+":8050")
		if repaired, err := n.enforcer.Repair(); err != nil || !repaired {
			t.Fatalf("Repair after a flush = %v, %v", repaired, err)
		}
		mustReach(t, confined, pkgAddr+":8050")
		mustNotReach(t, confined, otherAddr+":8050")
	})

	t.Run("removal", func(t *testing.T) {
		// A fresh agent that never applied it removes what is left.
		fresh := n.newEnforcer(t)
		if err := fresh.Remove(confined.Tap); err != nil {
			t.Fatal(err)
		}
		if rs := n.ruleset(t); strings.Contains(rs, confined.Tap) || strings.Contains(rs, confined.IP.String()) {
			t.Fatalf("objects of the removed Machine are left:\n%s", rs)
		}
		if taps, err := fresh.Confined(); err != nil || len(taps) != 0 {
			t.Fatalf("Confined() = %v, %v", taps, err)
		}
		mustReach(t, confined, otherAddr+":8050")
	})
}

func secs(n int) time.Duration { return time.Duration(n) * time.Second }

// TestMasquerade has the outside forget the route back to the guest
// network: answers reach a guest only once the node masquerades on its
// uplink.
func TestMasquerade(t *testing.T) {
	n := newTestNode(t)
	g := n.guest(t, "team-a", "vm", "10.88.1.2")
	serveTCP(t, n.outside, otherAddr+":8050")
	mustReach(t, g, otherAddr+":8050")
	run(t, "ip", "-n", n.outside, "route", "del", n.network.String())
	mustNotReach(t, g, otherAddr+":8050")
	run(t, "ip", "-n", n.host, "route", "add", "default", "via", uplinkOutside)
	uplink, err := DefaultRouteInterface(n.host)
	if err != nil || uplink != "up0" {
		t.Fatalf("DefaultRouteInterface = %q, %v; want up0", uplink, err)
	}
	n.enforcer.Masquerade = uplink
	if err := n.enforcer.Setup(); err != nil {
		t.Fatal(err)
	}
	mustReach(t, g, otherAddr+":8050")

	// A guest address behind the uplink (a guest on another node) is
	// reached with the guest's own address, not the node's: without the
	// outside's route back to the guest network the answers are lost,
	// with it they arrive.
	peerGuest := "10.88.200.5"
	run(t, "ip", "-n", n.outside, "addr", "add", peerGuest+"/32", "dev", "lo")
	run(t, "ip", "-n", n.host, "route", "add", peerGuest+"/32", "via", uplinkOutside)
	// On the guest's own /16, so through the gateway as proxy ARP on the
	// bridge would send it with guests on several nodes.
	run(t, "ip", "-n", g.netns, "route", "add", peerGuest+"/32", "via", n.gateway.String())
	serveTCP(t, n.outside, peerGuest+":8050")
	// The other node's guest is of the same namespace, so the baseline
	// lets its answers onto g's tap.
	if err := n.baseline.SetNamespaceAddresses(map[string][]netip.Addr{"team-a": {netip.MustParseAddr(peerGuest)}}); err != nil {
		t.Fatal(err)
	}
	mustNotReach(t, g, peerGuest+":8050")
	run(t, "ip", "-n", n.outside, "route", "add", "10.88.1.0/24", "via", uplinkNode)
	mustReach(t, g, peerGuest+":8050")

	bad := &Enforcer{NetNS: n.host, Bridge: n.bridge, Network: n.network, Gateway: n.gateway, Masquerade: "up0 accept"}
	if err := bad.Setup(); err == nil || !strings.Contains(err.Error(), "--egress-masquerade") {
		t.Fatalf("Setup with a masquerade interface that is not a name: %v", err)
	}
}

// TestSharedNamespaceMigration is kairon-local during a migration: two
// agents on one bridge, the Machine's tap on each, the same address. The
// target's rules take the address over; the source's removal leaves them.
func TestSharedNamespaceMigration(t *testing.T) {
	n := newTestNode(t)
	g := n.guest(t, "team-a", "vm", "10.88.1.2")
	serveTCP(t, n.outside, pkgAddr+":8050")
	serveTCP(t, n.outside, otherAddr+":8050")
	policy := mustCompile(t, kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{pkgAddr + "/32"}})
	if err := n.enforcer.Apply(g.Machine, policy); err != nil {
		t.Fatal(err)
	}
	target := n.newEnforcer(t)
	onTarget := g.Machine
	onTarget.Tap = network.TapName("node-2", "team-a_vm")
	if err := target.Apply(onTarget, policy); err != nil {
		t.Fatalf("the target confining the same address: %v", err)
	}
	// The target's agent pins its tap to the Machine's MAC before it
	// confines it: the source's Repair then leaves the Machine's entry to
	// the target's chain instead of taking it back at every tick.
	if err := n.baseline.Ensure(network.Guest{Tap: onTarget.Tap, Namespace: "team-a", MAC: g.MAC, IP: g.IP}); err != nil {
		t.Fatal(err)
	}
	if repaired, err := n.enforcer.Repair(); err != nil || repaired {
		t.Fatalf("the source's Repair during the migration = %v, %v", repaired, err)
	}
	if err := n.enforcer.Remove(g.Tap); err != nil {
		t.Fatalf("the source removing its tap: %v", err)
	}
	if rs := n.ruleset(t); strings.Contains(rs, g.Tap) || !strings.Contains(rs, keyText(g.Machine)+" : goto e_"+onTarget.Tap) {
		t.Fatalf("after the source's removal:\n%s", rs)
	}
	// The guest (still on the source's veth here) is confined by the
	// target's chain, which matches its address.
	mustReach(t, g, pkgAddr+":8050")
	mustNotReach(t, g, otherAddr+":8050")
	if repaired, err := target.Repair(); err != nil || repaired {
		t.Fatalf("Repair = %v, %v", repaired, err)
	}
	if err := target.Remove(onTarget.Tap); err != nil {
		t.Fatal(err)
	}
	if rs := n.ruleset(t); strings.Contains(rs, "10.88.1.2") || strings.Contains(rs, onTarget.Tap) {
		t.Fatalf("objects left:\n%s", rs)
	}
}

func TestLeanScript(t *testing.T) {
	e := &Enforcer{Network: netip.MustParsePrefix("10.88.0.0/16"), Gateway: netip.MustParseAddr("10.88.0.1"), DNSPort: 5353, SNIPort: 5354}
	m := Machine{Namespace: "team-a", Name: "vm", Tap: "kt0123456789", MAC: macOf("team-a", "vm"), IP: netip.MustParseAddr("10.88.1.2")}
	sni := mustCompile(t, kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"203.0.113.0/24"}, AllowSNI: []kaironv1.ServerName{"pkg.test"}})
	full := e.machineScript(m, sni, nil)
	fresh := lean(full, true, true)
	if strings.Contains(fresh, "flush chain") || strings.Contains(fresh, "add chain") || !strings.Contains(fresh, "create chain inet kairon_egress e_kt0123456789\n") ||
		strings.Contains(fresh, "delete element") {
		t.Errorf("fresh script still flushes, adds chains or deletes:\n%s", fresh)
	}
	// The SNI entry the policy needs stays; only the defensive pair goes.
	if !strings.Contains(fresh, "add element inet kairon_egress sni_5354 { "+keyText(m)+" : goto s_kt0123456789 }\n") ||
		strings.Count(fresh, "sni_5354 { "+keyText(m)) != 1 {
		t.Errorf("fresh script lost or doubled the SNI entry:\n%s", fresh)
	}
	if again := lean(full, false, false); again != full {
		t.Errorf("lean without knowledge changed the script")
	}
	known := lean(full, false, true)
	if !strings.Contains(known, "flush chain inet kairon_egress e_kt0123456789\n") || strings.Contains(known, "delete element inet kairon_egress sni_") {
		t.Errorf("a known Machine's script must flush, and lose only the SNI pair:\n%s", known)
	}
}
