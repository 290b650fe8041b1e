package egress

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// The nft text the enforcer wrote before it spoke netlink, kept as the
// reference the netlink batches are compared with
// (TestNetlinkMatchesScript): each batch must list as its script does.

func (e *Enforcer) setupScript() string {
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format+"\n", args...) }
	b := "bridge " + Table
	w("add table %s", b)
	w("add map %s egress_vmap { type ifname : verdict; }", b)
	// The forward hook sees the frames the bridge passes from one port to
	// another, not those for the node: after the baseline's (priority 0),
	// and a drop in either table is final.
	w("add chain %s forward { type filter hook forward priority 10; policy accept; }", b)
	w("flush chain %s forward", b)
	w("add rule %s forward iifname vmap @egress_vmap", b)

	i := "inet " + Table
	w("add table %s", i)
	w("add map %s egress4 { type ipv4_addr . ether_addr : verdict; }", i)
	w("add set %s denied4 { type ipv4_addr; flags interval; auto-merge; }", i)
	w("add chain %s forward { type filter hook forward priority 10; policy accept; }", i)
	w("flush chain %s forward", i)
	w("add rule %s forward ip saddr . ether saddr vmap @egress4", i)
	if e.DNSPort != 0 {
		// One chain and set per proxy port: agents sharing the namespace
		// (kairon-local) each have their own proxy. Before the usual dstnat
		// (-100), so that no other DNAT of the node (kube-proxy) takes a
		// confined guest's DNS elsewhere first.
		w("add set %s %s { type ipv4_addr . ether_addr; }", i, e.dnsSet())
		w("add chain %s %s { type nat hook prerouting priority -110; policy accept; }", i, e.dnsSet())
		w("flush chain %s %s", i, e.dnsSet())
		w("add rule %s %s ip saddr . ether saddr @%s meta l4proto { tcp, udp } th dport 53 redirect to :%d", i, e.dnsSet(), e.dnsSet(), e.DNSPort)
	}
	if e.SNIPort != 0 {
		// As the DNS proxy's: one map and chain per proxy port. A map
		// entry sends a guest's new connections to its own nat chain,
		// which redirects those its allowSNI grants must check.
		w("add map %s %s { type ipv4_addr . ether_addr : verdict; }", i, e.sniMap())
		w("add chain %s %s { type nat hook prerouting priority -110; policy accept; }", i, e.sniMap())
		w("flush chain %s %s", i, e.sniMap())
		w("add rule %s %s meta l4proto tcp ip saddr . ether saddr vmap @%s", i, e.sniMap(), e.sniMap())
	}
	if e.Masquerade != "" {
		// One chain per uplink, as the proxy's: agents sharing the
		// namespace may name different ones.
		c := "masq_" + e.Masquerade
		w("add chain %s %s { type nat hook postrouting priority 100; policy accept; }", i, c)
		w("flush chain %s %s", i, c)
		w("add rule %s %s oifname %q ip saddr %s ip daddr != %s masquerade", i, c, e.Masquerade, e.Network.Masked(), e.Network.Masked())
	}
	var denied []string
	for _, p := range append([]netip.Prefix{e.Network.Masked()}, AlwaysDenied...) {
		if p.Addr().Is4() {
			denied = append(denied, p.String())
		}
	}
	w("add element %s denied4 { %s }", i, strings.Join(denied, ", "))
	return s.String()
}

// l4 is the transport match of a grant in the filter chain: its ports for
// TCP and UDP, or every protocol but ICMP. A grant restricted by SNI
// allows no TCP here: its connections go to the SNI proxy in the nat chain
// and never reach this chain, and without the proxy (SNIPort 0) they are
// closed rather than unchecked.
func l4(g Grant) string {
	protos := "{ tcp, udp }"
	if len(g.SNI) > 0 {
		protos = "udp"
	}
	if len(g.Ports) == 0 {
		if len(g.SNI) > 0 {
			return "meta l4proto udp"
		}
		return "meta l4proto != { icmp, ipv6-icmp }"
	}
	ports := make([]string, len(g.Ports))
	for i, p := range g.Ports {
		ports[i] = p.String()
	}
	return fmt.Sprintf("meta l4proto %s th dport { %s }", protos, strings.Join(ports, ", "))
}

func nets4(nets []netip.Prefix, explicit func(netip.Prefix) bool, want bool) string {
	var out []string
	for _, n := range nets {
		if n.Addr().Is4() && explicit(n) == want {
			out = append(out, n.String())
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "{ " + strings.Join(out, ", ") + " }"
}

// machineScript writes m's chains, its learned sets (kept if they exist:
// an unchanged grant keeps what its guest resolved) and its map entries,
// and deletes the learned sets of grants it no longer has.
func (e *Enforcer) machineScript(m Machine, p *Policy, staleSets []string) string {
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format+"\n", args...) }
	b := "bridge " + Table
	i := "inet " + Table
	tap := m.Tap

	w("add chain %s e_%s", b, tap)
	w("flush chain %s e_%s", b, tap)
	for _, g := range p.Grants {
		if set := nets4(g.Nets, e.explicit, true); set != "" {
			w("add rule %s e_%s ip daddr %s accept", b, tap, set)
		}
	}
	w("add rule %s e_%s ether type arp accept", b, tap)
	w("add rule %s e_%s drop", b, tap)

	w("add chain %s e_%s", i, tap)
	w("flush chain %s e_%s", i, tap)
	for _, g := range p.Grants {
		if len(g.FQDNs) > 0 {
			// Bounded: a full set refuses the answer (SERVFAIL) rather
			// than grow with whatever a guest resolves.
			w("add set %s %s { type ipv4_addr; size 4096; flags timeout; }", i, learnedSetName(tap, g.ID()))
		}
	}
	for _, r := range DenyReasons {
		w("add counter %s %s", i, counterName(tap, r))
		// The destinations dropped in the last minute, a few of them, for
		// the Machine's Warning event (DeniedDestinations).
		w("add set %s %s { type ipv4_addr . inet_proto . inet_service; size %d; flags dynamic,timeout; timeout %ds; }", i, recentName(tap, r), recentSize, int(recentWindow/time.Second))
	}
	// deny drops what match matches, counting it under reason and
	// recording its destination. The record is a rule of its own: adding
	// to a full set fails the rule, which must not spare the packet.
	deny := func(match, reason string) {
		w("add rule %s e_%s %s add @%s { ip daddr . meta l4proto . th dport }", i, tap, match, recentName(tap, reason))
		w("add rule %s e_%s %s counter name %q drop", i, tap, match, counterName(tap, reason))
	}
	w("add rule %s e_%s ct state established,related accept", i, tap)
	rules := func(explicit bool) {
		for _, g := range p.Grants {
			var dests []string
			if set := nets4(g.Nets, e.explicit, explicit); set != "" {
				dests = append(dests, set)
			}
			if !explicit && len(g.FQDNs) > 0 {
				dests = append(dests, "@"+learnedSetName(tap, g.ID()))
			}
			for _, d := range dests {
				w("add rule %s e_%s ip daddr %s %s accept", i, tap, d, l4(g))
				if g.ICMP {
					w("add rule %s e_%s ip daddr %s icmp type echo-request accept", i, tap, d)
				}
			}
		}
	}
	rules(true)
	deny("ip daddr @denied4", ReasonIP)
	rules(false)
	// What no grant accepted, by why, for kairon_egress_denied_total.
	deny("meta l4proto { icmp, ipv6-icmp }", ReasonICMP)
	for _, g := range p.Grants {
		var dests []string
		if set := nets4(g.Nets, func(netip.Prefix) bool { return true }, true); set != "" {
			dests = append(dests, set)
		}
		if len(g.FQDNs) > 0 {
			dests = append(dests, "@"+learnedSetName(tap, g.ID()))
		}
		for _, d := range dests {
			deny("ip daddr "+d, ReasonPort)
		}
	}
	deny("meta nfproto ipv4", ReasonIP)
	// Only IPv4 reaches this chain (the map is by IPv4 source); anything
	// else is dropped all the same rather than fall back to the base
	// chain's accept.
	w("add rule %s e_%s drop", i, tap)

	if e.SNIPort != 0 {
		s.WriteString(e.sniScript(m, p))
	}
	// Last: until both chains are rewritten, their old rules refer to
	// these sets, and the kernel refuses to delete a set in use.
	for _, set := range staleSets {
		w("delete set %s %s", i, set)
	}
	w("add element %s egress_vmap { %q : goto e_%s }", b, tap, tap)
	w("add element %s egress4 { %s : goto e_%s }", i, keyText(m), tap)
	if e.DNSPort != 0 {
		w("add element %s %s { %s }", i, e.dnsSet(), keyText(m))
	}
	return s.String()
}

// sniScript writes m's nat chain: the TCP connections that only a grant
// with allowSNI allows go to the SNI proxy; those another grant allows
// without it pass on to the filter (union: a name check is a restriction
// of its own grant, never of another's). The chain follows the filter
// chain's order, so that what the filter drops is never redirected.
func (e *Enforcer) sniScript(m Machine, p *Policy) string {
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format+"\n", args...) }
	i := "inet " + Table
	tap := m.Tap
	w("add chain %s s_%s", i, tap)
	w("flush chain %s s_%s", i, tap)
	// Out of the map first (added so that the delete cannot fail): a
	// policy without allowSNI leaves no entry behind.
	w("add element %s %s { %s : goto s_%s }", i, e.sniMap(), keyText(m), tap)
	w("delete element %s %s { %s }", i, e.sniMap(), keyText(m))
	checked := slices.ContainsFunc(p.Grants, func(g Grant) bool { return len(g.SNI) > 0 })
	if !checked {
		return s.String()
	}
	rules := func(explicit bool) {
		for _, sni := range []bool{false, true} {
			for _, g := range p.Grants {
				if (len(g.SNI) > 0) != sni {
					continue
				}
				var dests []string
				if set := nets4(g.Nets, e.explicit, explicit); set != "" {
					dests = append(dests, set)
				}
				if !explicit && len(g.FQDNs) > 0 {
					dests = append(dests, "@"+learnedSetName(tap, g.ID()))
				}
				verdict := "return"
				if sni {
					verdict = fmt.Sprintf("redirect to :%d", e.SNIPort)
				}
				for _, d := range dests {
					w("add rule %s s_%s ip daddr %s %s %s", i, tap, d, tcpPorts(g), verdict)
				}
			}
		}
	}
	rules(true)
	w("add rule %s s_%s ip daddr @denied4 return", i, tap)
	rules(false)
	w("add element %s %s { %s : goto s_%s }", i, e.sniMap(), keyText(m), tap)
	return s.String()
}

// tcpPorts matches the TCP a grant allows.
func tcpPorts(g Grant) string {
	if len(g.Ports) == 0 {
		return "meta l4proto tcp"
	}
	ports := make([]string, len(g.Ports))
	for i, p := range g.Ports {
		ports[i] = p.String()
	}
	return fmt.Sprintf("tcp dport { %s }", strings.Join(ports, ", "))
}

// keyText is a Machine's key in the maps keyed by Machine, as nft writes
// it.
func keyText(m Machine) string { return m.IP.String() + " . " + m.MAC }

// forgetKey takes the entries of key (keyText) out. The egress4 entry
// goes only if it points at tap's chain (owner is the tap it points at in
// the kernel): in kairon-local a migration's source and target share the
// namespace and the guest's key, and the entry may be the other agent's
// by now.
func (e *Enforcer) forgetKey(tap string, key string, owner string) string {
	i := "inet " + Table
	ip := key
	var s string
	if owner == tap {
		s = fmt.Sprintf("delete element %s egress4 { %s }\n", i, ip)
	}
	if e.DNSPort != 0 {
		s += fmt.Sprintf("add element %[1]s %[2]s { %[3]s }\ndelete element %[1]s %[2]s { %[3]s }\n", i, e.dnsSet(), ip)
	}
	if e.SNIPort != 0 {
		// This agent's own map, as the DNS set: never another tap's entry.
		s += fmt.Sprintf("add chain %[1]s s_%[4]s\nadd element %[1]s %[2]s { %[3]s : goto s_%[4]s }\ndelete element %[1]s %[2]s { %[3]s }\n", i, e.sniMap(), ip, tap)
	}
	return s
}

// removeScript takes out everything of tap and of the Machine key (keyText;
// empty: none). Each object is added before it is deleted (nft 1.0.6 has
// no "destroy"), so the script succeeds whatever is left.
func (e *Enforcer) removeScript(tap string, key string, owner string, sets []string) string {
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format+"\n", args...) }
	b := "bridge " + Table
	i := "inet " + Table
	w("add chain %s e_%s", b, tap)
	w("add element %s egress_vmap { %q : goto e_%s }", b, tap, tap)
	w("delete element %s egress_vmap { %q }", b, tap)
	w("flush chain %s e_%s", b, tap)
	w("delete chain %s e_%s", b, tap)
	w("add chain %s e_%s", i, tap)
	if key != "" {
		s.WriteString(e.forgetKey(tap, key, owner))
	}
	w("flush chain %s e_%s", i, tap)
	w("delete chain %s e_%s", i, tap)
	w("add chain %s s_%s", i, tap)
	w("flush chain %s s_%s", i, tap)
	w("delete chain %s s_%s", i, tap)
	for _, set := range sets {
		w("delete set %s %s", i, set)
	}
	for _, r := range DenyReasons {
		w("add counter %s %s", i, counterName(tap, r))
		w("delete counter %s %s", i, counterName(tap, r))
		w("add set %s %s { type ipv4_addr . inet_proto . inet_service; size %d; flags dynamic,timeout; timeout %ds; }", i, recentName(tap, r), recentSize, int(recentWindow/time.Second))
		w("delete set %s %s", i, recentName(tap, r))
	}
	return s.String()
}

// lean drops from a Machine's script what a transaction need not do when
// this agent knows the kernel's state, since flushing a chain and deleting
// a set element make the kernel's commit several times slower (a
// Machine's script: 10 ms bare, 28 ms with them, on this project's test
// hosts). fresh: the Machine has no chain yet, so nothing to flush, and
// its chains are created with "create", which fails (and so sends Apply
// down its careful path) if they exist after all. noSNIEntry: the SNI map
// holds no entry for the address, so the defensive add-and-delete of one
// goes.
func lean(script string, fresh, noSNIEntry bool) string {
	lines := strings.SplitAfter(script, "\n")
	var out strings.Builder
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch {
		case fresh && strings.HasPrefix(l, "flush chain "):
			continue
		case fresh && strings.HasPrefix(l, "add chain "):
			l = "create chain " + strings.TrimPrefix(l, "add chain ")
		case noSNIEntry && strings.HasPrefix(l, "add element inet "+Table+" sni_") && i+1 < len(lines) &&
			strings.HasPrefix(lines[i+1], "delete element inet "+Table+" sni_"):
			i++ // and its delete
			continue
		}
		out.WriteString(l)
	}
	return out.String()
}
