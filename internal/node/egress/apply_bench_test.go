package egress

import (
	"fmt"
	"net/netip"
	"testing"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules/egresspolicy"
)

// crowdedEnforcer is an enforcer whose namespace already confines others
// Machines, each under a policy as a claim's: the table a bind writes
// into on a busy node.
func crowdedEnforcer(b *testing.B, others int) *Enforcer {
	b.Helper()
	ns := netlabNamespace(b)
	e := &Enforcer{NetNS: ns, Bridge: "kbr0", Network: netip.MustParsePrefix("10.88.0.0/16"), Gateway: netip.MustParseAddr("10.88.0.1"), DNSPort: 5353, SNIPort: 5354}
	if err := e.Setup(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = RemoveTables(ns) })
	p, err := egresspolicy.Compile([]egresspolicy.NamedPolicy{{Name: "p", Egress: kaironv1.EgressRules{
		AllowCidrs: []kaironv1.CIDR{"203.0.113.0/24"}, AllowFqdns: []kaironv1.Hostname{"pkg.test"}, AllowPorts: []kaironv1.PortRange{"443"},
	}}})
	if err != nil {
		b.Fatal(err)
	}
	for i := range others {
		m := Machine{Namespace: "crowd", Name: fmt.Sprint(i), Tap: fmt.Sprintf("kc%010d", i), MAC: macOf("crowd", fmt.Sprint(i)), IP: netip.AddrFrom4([4]byte{10, 88, byte(200 + i/250), byte(2 + i%250)})}
		if err := e.Apply(m, p); err != nil {
			b.Fatal(err)
		}
	}
	return e
}

// BenchmarkApply is the node's step of a bind with egress: one Machine's
// rules rewritten for a new policy (alternating two), in a namespace.
func BenchmarkApply(b *testing.B) { benchmarkRewrite(b, crowdedEnforcer(b, 0)) }

// BenchmarkApplyCrowded is BenchmarkApply with 200 Machines already
// confined in the namespace: its cost must not grow with them.
func BenchmarkApplyCrowded(b *testing.B) { benchmarkRewrite(b, crowdedEnforcer(b, 200)) }

// BenchmarkApplyNew is Apply for a Machine never confined before, as a
// warm member taken by a claim with egress is.
func BenchmarkApplyNew(b *testing.B) { benchmarkNew(b, crowdedEnforcer(b, 0)) }

// BenchmarkApplyNewCrowded is BenchmarkApplyNew with 200 Machines already
// confined in the namespace.
func BenchmarkApplyNewCrowded(b *testing.B) { benchmarkNew(b, crowdedEnforcer(b, 200)) }

func benchmarkRewrite(b *testing.B, e *Enforcer) {
	m := Machine{Namespace: "team-a", Name: "vm", Tap: "kt0123456789", MAC: macOf("team-a", "vm"), IP: netip.MustParseAddr("10.88.1.2")}
	var policies [2]*Policy
	for i := range policies {
		p, err := egresspolicy.Compile([]egresspolicy.NamedPolicy{{Name: "p", Egress: kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{kaironv1.CIDR(fmt.Sprintf("203.0.113.%d/32", i))}, AllowPorts: []kaironv1.PortRange{"443"}}}})
		if err != nil {
			b.Fatal(err)
		}
		policies[i] = p
	}
	b.ResetTimer()
	for i := range b.N {
		if err := e.Apply(m, policies[i%2]); err != nil {
			b.Fatal(err)
		}
	}
}

func benchmarkNew(b *testing.B, e *Enforcer) {
	p, err := egresspolicy.Compile([]egresspolicy.NamedPolicy{{Name: "p", Egress: kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"203.0.113.0/24"}, AllowPorts: []kaironv1.PortRange{"443"}}}})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		m := Machine{Namespace: "team-a", Name: "vm", Tap: fmt.Sprintf("kt%010d", i), MAC: macOf("team-a", "vm"), IP: netip.AddrFrom4([4]byte{10, 88, byte(1 + i/250), byte(2 + i%250)})}
		b.StartTimer()
		if err := e.Apply(m, p); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := e.Remove(m.Tap); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLearn is the DNS proxy's step before it answers a confined
// guest: two addresses into a learned set, among 200 confined Machines.
func BenchmarkLearn(b *testing.B) {
	e := crowdedEnforcer(b, 200)
	m := Machine{Namespace: "crowd", Name: "0", Tap: "kc0000000000", MAC: macOf("crowd", "0"), IP: netip.AddrFrom4([4]byte{10, 88, 200, 2})}
	addrs := []netip.Addr{netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11")}
	b.ResetTimer()
	for range b.N {
		if err := e.Learn(m.IP, "pkg.test", addrs, 60e9); err != nil {
			b.Fatal(err)
		}
	}
}
