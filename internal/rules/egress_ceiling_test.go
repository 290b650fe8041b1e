package rules

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules/egresspolicy"
)

func TestEgressWithin(t *testing.T) {
	ceiling := kaironv1.EgressRules{
		AllowFqdns: []kaironv1.Hostname{"pypi.org", "*.pythonhosted.org", "*.test"},
		AllowCidrs: []kaironv1.CIDR{"10.0.0.0/8", "2001:db8::/32"},
		AllowPorts: []kaironv1.PortRange{"443", "8000-8100"},
	}
	for _, c := range []struct {
		name  string
		claim kaironv1.EgressRules
		want  string // "" when within; else a fragment of the error
	}{
		{"same as the ceiling", ceiling, ""},
		{"exact name", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pypi.org"}, AllowPorts: []kaironv1.PortRange{"443"}}, ""},
		{"name under a wildcard", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"files.pythonhosted.org", "A.B.Test."}, AllowPorts: []kaironv1.PortRange{"443"}}, ""},
		{"narrower wildcard", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"*.cdn.test"}, AllowPorts: []kaironv1.PortRange{"8050"}}, ""},
		{"the wildcard's own domain", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pythonhosted.org"}, AllowPorts: []kaironv1.PortRange{"443"}}, "allowFqdns[0]"},
		{"wider wildcard", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"*.org"}, AllowPorts: []kaironv1.PortRange{"443"}}, "allowFqdns[0]"},
		{"other name", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"evil.com"}, AllowPorts: []kaironv1.PortRange{"443"}}, `"evil.com"`},
		{"sub-CIDR", kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"10.1.2.0/24", "2001:db8:1::/48"}, AllowPorts: []kaironv1.PortRange{"8000-8010"}}, ""},
		{"wider CIDR", kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"0.0.0.0/0"}, AllowPorts: []kaironv1.PortRange{"443"}}, "allowCidrs[0]"},
		{"address outside", kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"192.168.1.1/32"}, AllowPorts: []kaironv1.PortRange{"443"}}, "allowCidrs[0]"},
		{"every port", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pypi.org"}}, "allowPorts is empty"},
		{"port range past the ceiling", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pypi.org"}, AllowPorts: []kaironv1.PortRange{"8000-8200"}}, "allowPorts[0]"},
		{"ICMP", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pypi.org"}, AllowPorts: []kaironv1.PortRange{"443"}, AllowIcmp: true}, "allowIcmp"},
		{"SNI only narrows", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pypi.org"}, AllowPorts: []kaironv1.PortRange{"443"}, AllowSNI: []kaironv1.ServerName{"pypi.org"}}, ""},
		{"DNS past the ceiling", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pypi.org"}, AllowPorts: []kaironv1.PortRange{"443"}, AllowDNS: []kaironv1.ServerName{"*.com"}}, `"*.com"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := EgressWithin(c.claim, ceiling)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("error %v, want one naming %s", err, c.want)
			}
		})
	}
	sni := kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"10.0.0.0/8"}, AllowSNI: []kaironv1.ServerName{"*.corp.test"}}
	if err := EgressWithin(kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"10.0.0.0/8"}}, sni); err == nil || !strings.Contains(err.Error(), "allowSNI is empty") {
		t.Errorf("a claim without allowSNI under a ceiling with it: %v", err)
	}
	if err := EgressWithin(kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"10.0.0.0/8"}, AllowSNI: []kaironv1.ServerName{"git.corp.test"}}, sni); err != nil {
		t.Errorf("a claim naming a server within the ceiling's allowSNI: %v", err)
	}
}

// TestEgressWithinAgreesWithTheEnforcer: the ceiling says a claim is within
// exactly when every grant the claim compiles to (the Policy the node
// enforces) lets nothing through that the ceiling's compiled Policy does
// not. What passes is judged as the enforcer and its proxies judge it
// (Pattern.Match, Grant.AllowsPort, Policy.AllowsQuery, prefix containment)
// on probes built from both sides' edges: each name and one name below
// it, each network's first and last address and their neighbours, each
// port range's ends and their neighbours.
func TestEgressWithinAgreesWithTheEnforcer(t *testing.T) {
	type rules = kaironv1.EgressRules
	type fqdns = []kaironv1.Hostname
	type cidrs = []kaironv1.CIDR
	type ports = []kaironv1.PortRange
	type names = []kaironv1.ServerName
	for _, c := range []struct {
		name           string
		claim, ceiling rules
	}{
		{"exact under exact", rules{AllowFqdns: fqdns{"pypi.org"}}, rules{AllowFqdns: fqdns{"PyPI.org."}}},
		{"exact past exact", rules{AllowFqdns: fqdns{"evil.org"}}, rules{AllowFqdns: fqdns{"pypi.org"}}},
		{"exact under a wildcard", rules{AllowFqdns: fqdns{"a.b.test"}}, rules{AllowFqdns: fqdns{"*.test"}}},
		{"a wildcard's own domain", rules{AllowFqdns: fqdns{"test"}}, rules{AllowFqdns: fqdns{"*.test"}}},
		{"narrower wildcard", rules{AllowFqdns: fqdns{"*.cdn.test"}}, rules{AllowFqdns: fqdns{"*.test"}}},
		{"the same wildcard", rules{AllowFqdns: fqdns{"*.test"}}, rules{AllowFqdns: fqdns{"*.test"}}},
		{"wider wildcard", rules{AllowFqdns: fqdns{"*.test"}}, rules{AllowFqdns: fqdns{"*.cdn.test"}}},
		{"wildcard under its exact domain", rules{AllowFqdns: fqdns{"*.cdn.test"}}, rules{AllowFqdns: fqdns{"cdn.test"}}},
		{"look-alike suffix", rules{AllowFqdns: fqdns{"evilcdn.test"}}, rules{AllowFqdns: fqdns{"*.cdn.test"}}},
		{"port under a range", rules{AllowFqdns: fqdns{"pypi.org"}, AllowPorts: ports{"8050"}}, rules{AllowFqdns: fqdns{"pypi.org"}, AllowPorts: ports{"443", "8000-8100"}}},
		{"range under a range", rules{AllowFqdns: fqdns{"pypi.org"}, AllowPorts: ports{"8000-8100"}}, rules{AllowFqdns: fqdns{"pypi.org"}, AllowPorts: ports{"8000-8100"}}},
		{"range past a range", rules{AllowFqdns: fqdns{"pypi.org"}, AllowPorts: ports{"8000-8101"}}, rules{AllowFqdns: fqdns{"pypi.org"}, AllowPorts: ports{"8000-8100"}}},
		{"range across adjacent ranges", rules{AllowFqdns: fqdns{"pypi.org"}, AllowPorts: ports{"8050-8150"}}, rules{AllowFqdns: fqdns{"pypi.org"}, AllowPorts: ports{"8000-8100", "8101-8200"}}},
		{"range across a gap", rules{AllowFqdns: fqdns{"pypi.org"}, AllowPorts: ports{"8050-8150"}}, rules{AllowFqdns: fqdns{"pypi.org"}, AllowPorts: ports{"8000-8100", "8102-8200"}}},
		{"every port under some", rules{AllowFqdns: fqdns{"pypi.org"}}, rules{AllowFqdns: fqdns{"pypi.org"}, AllowPorts: ports{"443"}}},
		{"some ports under every port", rules{AllowFqdns: fqdns{"pypi.org"}, AllowPorts: ports{"1-65535"}}, rules{AllowFqdns: fqdns{"pypi.org"}}},
		{"sub-CIDR", rules{AllowCidrs: cidrs{"10.1.2.0/24", "2001:db8:1::/48"}}, rules{AllowCidrs: cidrs{"10.0.0.0/8", "2001:db8::/32"}}},
		{"the same CIDR, unmasked", rules{AllowCidrs: cidrs{"10.1.2.3/8"}}, rules{AllowCidrs: cidrs{"10.0.0.0/8"}}},
		{"wider CIDR", rules{AllowCidrs: cidrs{"10.0.0.0/7"}}, rules{AllowCidrs: cidrs{"10.0.0.0/8"}}},
		{"one address outside", rules{AllowCidrs: cidrs{"11.0.0.0/32"}}, rules{AllowCidrs: cidrs{"10.0.0.0/8"}}},
		{"IPv6 under IPv4", rules{AllowCidrs: cidrs{"::ffff:10.0.0.0/104"}}, rules{AllowCidrs: cidrs{"10.0.0.0/8"}}},
		{"a CIDR under names", rules{AllowCidrs: cidrs{"10.0.0.1/32"}}, rules{AllowFqdns: fqdns{"*.test"}}},
		{"a name under CIDRs", rules{AllowFqdns: fqdns{"pypi.org"}}, rules{AllowCidrs: cidrs{"0.0.0.0/0"}}},
		{"ports on a CIDR", rules{AllowCidrs: cidrs{"10.0.0.0/24"}, AllowPorts: ports{"443"}}, rules{AllowCidrs: cidrs{"10.0.0.0/8"}, AllowPorts: ports{"80-443"}}},
		{"SNI only narrows", rules{AllowCidrs: cidrs{"10.0.0.0/8"}, AllowSNI: names{"git.corp.test"}}, rules{AllowCidrs: cidrs{"10.0.0.0/8"}}},
		{"no SNI under SNI", rules{AllowCidrs: cidrs{"10.0.0.0/8"}}, rules{AllowCidrs: cidrs{"10.0.0.0/8"}, AllowSNI: names{"*.corp.test"}}},
		{"SNI under a wildcard SNI", rules{AllowCidrs: cidrs{"10.0.0.0/8"}, AllowSNI: names{"git.corp.test"}}, rules{AllowCidrs: cidrs{"10.0.0.0/8"}, AllowSNI: names{"*.corp.test"}}},
		{"SNI past a wildcard SNI", rules{AllowCidrs: cidrs{"10.0.0.0/8"}, AllowSNI: names{"*.test"}}, rules{AllowCidrs: cidrs{"10.0.0.0/8"}, AllowSNI: names{"*.corp.test"}}},
		{"DNS under the ceiling's names", rules{AllowFqdns: fqdns{"pypi.org"}, AllowDNS: names{"*.pypi.org"}}, rules{AllowFqdns: fqdns{"pypi.org", "*.pypi.org"}}},
		{"DNS past the ceiling's names", rules{AllowFqdns: fqdns{"pypi.org"}, AllowDNS: names{"*.org"}}, rules{AllowFqdns: fqdns{"pypi.org"}}},
		{"ICMP under ICMP", rules{AllowCidrs: cidrs{"10.0.0.1/32"}, AllowIcmp: true}, rules{AllowCidrs: cidrs{"10.0.0.0/8"}, AllowIcmp: true}},
		{"ICMP past none", rules{AllowCidrs: cidrs{"10.0.0.1/32"}, AllowIcmp: true}, rules{AllowCidrs: cidrs{"10.0.0.0/8"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			claim, ceiling := mustCompileOne(t, c.claim), mustCompileOne(t, c.ceiling)
			witness, past := reachesPast(claim, ceiling, probesOf(claim, ceiling))
			err := EgressWithin(c.claim, c.ceiling)
			switch {
			case err == nil && past:
				t.Fatalf("the ceiling says within, but the enforcer lets %s through for the claim and not for the ceiling", witness)
			case err != nil && !past:
				t.Fatalf("the ceiling refuses (%v), but no probe passes for the claim that does not for the ceiling", err)
			}
		})
	}
}

func mustCompileOne(t *testing.T, e kaironv1.EgressRules) *egresspolicy.Policy {
	t.Helper()
	p, err := egresspolicy.Compile([]egresspolicy.NamedPolicy{{Name: "p", Egress: e}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// probe is one thing a guest may try: a DNS question, or a packet to a
// name's address or to an address, by TCP (with a TLS server name, or
// none: "") or UDP on a port, or an ICMP echo.
type probe struct {
	query string
	name  string
	addr  netip.Addr
	port  uint16
	icmp  bool
	udp   bool
	sni   string
}

func (p probe) String() string { return fmt.Sprintf("%+v", struct{ probe }{p}) }

// passes tells whether the enforcer lets p through under policy.
func passes(policy *egresspolicy.Policy, p probe) bool {
	if p.query != "" {
		return policy.AllowsQuery(p.query)
	}
	return slices.ContainsFunc(policy.Grants, func(g egresspolicy.Grant) bool {
		reached := slices.ContainsFunc(g.FQDNs, func(f egresspolicy.Pattern) bool { return p.name != "" && f.Match(p.name) }) ||
			slices.ContainsFunc(g.Nets, func(n netip.Prefix) bool { return p.addr.IsValid() && n.Contains(p.addr) })
		switch {
		case !reached:
			return false
		case p.icmp:
			return g.ICMP
		case !g.AllowsPort(p.port):
			return false
		case p.udp || len(g.SNI) == 0:
			return true
		}
		return slices.ContainsFunc(g.SNI, func(s egresspolicy.Pattern) bool { return p.sni != "" && s.Match(p.sni) })
	})
}

func reachesPast(claim, ceiling *egresspolicy.Policy, probes []probe) (probe, bool) {
	for _, p := range probes {
		if passes(claim, p) && !passes(ceiling, p) {
			return p, true
		}
	}
	return probe{}, false
}

// probesOf builds probes at the edges of both policies' patterns,
// networks and port ranges.
func probesOf(policies ...*egresspolicy.Policy) []probe {
	var names []string
	addName := func(p egresspolicy.Pattern) {
		if suffix, wild := strings.CutPrefix(string(p), "*."); wild {
			names = append(names, suffix, "x."+suffix, "y.x."+suffix, "evil"+suffix)
			return
		}
		names = append(names, string(p), "x."+string(p))
	}
	var addrs []netip.Addr
	ports := []uint16{1, 65535}
	for _, pol := range policies {
		for _, d := range pol.DNS {
			addName(d)
		}
		for _, g := range pol.Grants {
			for _, f := range slices.Concat(g.FQDNs, g.SNI) {
				addName(f)
			}
			for _, n := range g.Nets {
				first, last := n.Masked().Addr(), lastAddr(n)
				addrs = append(addrs, first, first.Prev(), last, last.Next())
			}
			for _, r := range g.Ports {
				ports = append(ports, r.Lo, r.Hi, max(r.Lo-1, 1), min(r.Hi+1, 65535))
			}
		}
	}
	var probes []probe
	for _, n := range names {
		probes = append(probes, probe{query: n}, probe{name: n, icmp: true})
	}
	for _, a := range addrs {
		if a.IsValid() {
			probes = append(probes, probe{addr: a, icmp: true})
		}
	}
	for _, port := range ports {
		for _, sni := range append([]string{""}, names...) {
			for _, n := range names {
				probes = append(probes, probe{name: n, port: port, sni: sni}, probe{name: n, port: port, udp: true})
			}
			for _, a := range addrs {
				if a.IsValid() {
					probes = append(probes, probe{addr: a, port: port, sni: sni}, probe{addr: a, port: port, udp: true})
				}
			}
		}
	}
	return probes
}

// lastAddr is the highest address of n.
func lastAddr(n netip.Prefix) netip.Addr {
	b := n.Masked().Addr().AsSlice()
	for i := n.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
