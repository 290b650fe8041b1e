// Package egress enforces MachineNetworkPolicies on a node: it compiles the
// policies selecting a Machine into one rule set (Compile), programs it
// into nftables at the Machine's tap (Enforcer), and answers the confined
// guests' DNS (DNSProxy), teaching the enforcer the addresses of allowed
// names. docs/guides/egress.md describes the behaviour.
//
// The enforcer programs nf_tables over netlink (github.com/google/nftables,
// netlink.go): Setup, Apply, Remove, Learn and RemoveTables are each one
// batch the kernel commits whole (Repair one per 50 Machines, each Machine
// whole in one), and the reads (what an earlier agent
// left, the drop counters and records, the learned sets the SNI proxy
// checks) are netlink dumps; no process is started on these paths. The
// agent keeps one netlink session into the namespace for its life. The nft
// command is used by the tests only: script_test.go keeps the nft text
// the enforcer once ran, and TestNetlinkMatchesScript checks that the
// batches list as that text does. DefaultRouteInterface still runs `ip
// route`, once at agent start.
package egress

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// PortRange is an inclusive range of destination ports.
type PortRange struct{ Lo, Hi uint16 }

func (p PortRange) String() string {
	if p.Lo == p.Hi {
		return strconv.Itoa(int(p.Lo))
	}
	return fmt.Sprintf("%d-%d", p.Lo, p.Hi)
}

// Pattern is a lower-case DNS name without a trailing dot, exact
// ("pkg.test") or a wildcard ("*.pkg.test", every name strictly below
// pkg.test, as Cilium's toFQDNs matchPattern).
type Pattern string

// Match tells whether name (any case, trailing dot or not) is allowed by p.
func (p Pattern) Match(name string) bool {
	name = canonicalName(name)
	if suffix, ok := strings.CutPrefix(string(p), "*."); ok {
		return strings.HasSuffix(name, "."+suffix) && len(name) > len(suffix)+1
	}
	return name == string(p)
}

func canonicalName(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// Grant is what one MachineNetworkPolicy allows. Grants are kept apart,
// not merged field by field: a policy allowing 10.0.0.0/8 on port 443 and
// another allowing pkg.test on port 80 must not allow 10.0.0.0/8 on 80.
type Grant struct {
	// Nets are allowAddresses, masked, sorted, overlapping ones kept.
	Nets []netip.Prefix
	// FQDNs are the names whose resolved addresses this grant allows.
	FQDNs []Pattern
	// Ports are the allowed destination ports for TCP and UDP; none means
	// every port (and every protocol but ICMP).
	Ports []PortRange
	// SNI, when not empty, restricts TCP to connections opening with a
	// TLS ClientHello naming one of these.
	SNI []Pattern
	// ICMP allows ICMP and ICMPv6 echo requests to Nets and the FQDNs'
	// addresses.
	ICMP bool
}

// ID names the grant's learned-address sets. It depends on the grant's
// content only, so an unchanged grant keeps its learned addresses when the
// Machine's other policies change or the agent restarts.
func (g Grant) ID() string {
	h := sha256.New()
	fmt.Fprintf(h, "%v|%v|%v|%v|%v", g.Nets, g.FQDNs, g.Ports, g.SNI, g.ICMP)
	return hex.EncodeToString(h.Sum(nil))[:10]
}

// Policy is the effective egress rule set of one Machine.
type Policy struct {
	// Grants, in the order of the policies' names; a packet passes if any
	// grant allows it.
	Grants []Grant
	// DNS is what the guest may query: every policy's allowDNS, or its
	// allowFqdns when allowDNS is empty.
	DNS []Pattern
}

// AllowsQuery tells whether the guest may ask about name.
func (p *Policy) AllowsQuery(name string) bool {
	for _, d := range p.DNS {
		if d.Match(name) {
			return true
		}
	}
	return false
}

// LearnFor lists the IDs of the grants whose allowFqdns cover name: the
// sets an answer about name fills.
func (p *Policy) LearnFor(name string) []string {
	var ids []string
	for _, g := range p.Grants {
		for _, f := range g.FQDNs {
			if f.Match(name) {
				ids = append(ids, g.ID())
				break
			}
		}
	}
	return ids
}

// NamedPolicy is a policy's spec.egress with the name errors report.
type NamedPolicy struct {
	Name   string
	Egress kaironv1.EgressRules
}

var labelPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// parsePattern accepts what the CRD's ServerName and Hostname accept, again:
// the agent is the last line and must not trust that the API server
// validated (an older CRD, a direct etcd write).
func parsePattern(s string, wildcard bool) (Pattern, error) {
	name := canonicalName(s)
	rest, isWild := strings.CutPrefix(name, "*.")
	if isWild && !wildcard {
		return "", fmt.Errorf("%q: a wildcard is not allowed here", s)
	}
	if rest == "" || len(rest) > 253 {
		return "", fmt.Errorf("%q is not a DNS name", s)
	}
	for _, label := range strings.Split(rest, ".") {
		if !labelPattern.MatchString(label) {
			return "", fmt.Errorf("%q is not a DNS name (label %q)", s, label)
		}
	}
	return Pattern(name), nil
}

func parsePort(s string) (PortRange, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	if !isRange {
		hi = lo
	}
	l, err1 := strconv.ParseUint(lo, 10, 16)
	h, err2 := strconv.ParseUint(hi, 10, 16)
	if err1 != nil || err2 != nil || l < 1 || h < l {
		return PortRange{}, fmt.Errorf("%q is not a port N or a range N-M with 1 <= N <= M <= 65535", s)
	}
	return PortRange{uint16(l), uint16(h)}, nil
}

func compileGrant(e kaironv1.EgressRules) (Grant, []Pattern, error) {
	var g Grant
	for i, c := range e.AllowCidrs {
		p, err := netip.ParsePrefix(strings.TrimSpace(string(c)))
		if err != nil {
			return g, nil, fmt.Errorf("allowCidrs[%d]: %q is not a CIDR such as 10.0.0.0/8 or 2001:db8::/32", i, c)
		}
		g.Nets = append(g.Nets, p.Masked())
	}
	for i, f := range e.AllowFqdns {
		p, err := parsePattern(string(f), true)
		if err != nil {
			return g, nil, fmt.Errorf("allowFqdns[%d]: %v", i, err)
		}
		g.FQDNs = append(g.FQDNs, p)
	}
	for i, s := range e.AllowSNI {
		p, err := parsePattern(string(s), true)
		if err != nil {
			return g, nil, fmt.Errorf("allowSNI[%d]: %v", i, err)
		}
		g.SNI = append(g.SNI, p)
	}
	for i, s := range e.AllowPorts {
		p, err := parsePort(string(s))
		if err != nil {
			return g, nil, fmt.Errorf("allowPorts[%d]: %v", i, err)
		}
		g.Ports = append(g.Ports, p)
	}
	var dns []Pattern
	for i, s := range e.AllowDNS {
		p, err := parsePattern(string(s), true)
		if err != nil {
			return g, nil, fmt.Errorf("allowDNS[%d]: %v", i, err)
		}
		dns = append(dns, p)
	}
	if len(e.AllowDNS) == 0 {
		dns = slices.Clone(g.FQDNs)
	}
	g.ICMP = e.AllowIcmp
	slices.SortFunc(g.Nets, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	g.Nets = slices.Compact(g.Nets)
	slices.Sort(g.FQDNs)
	g.FQDNs = slices.Compact(g.FQDNs)
	slices.Sort(g.SNI)
	g.SNI = slices.Compact(g.SNI)
	slices.SortFunc(g.Ports, func(a, b PortRange) int { return int(a.Lo)<<16 + int(a.Hi) - (int(b.Lo)<<16 + int(b.Hi)) })
	g.Ports = mergePorts(g.Ports)
	return g, dns, nil
}

// mergePorts joins overlapping and adjacent ranges of a sorted list: nft
// refuses overlapping elements in one anonymous interval set.
func mergePorts(ps []PortRange) []PortRange {
	var out []PortRange
	for _, p := range ps {
		if n := len(out); n > 0 && int(p.Lo) <= int(out[n-1].Hi)+1 {
			out[n-1].Hi = max(out[n-1].Hi, p.Hi)
			continue
		}
		out = append(out, p)
	}
	return out
}

// Compile turns the policies selecting one Machine into its effective rule
// set. No policy gives a nil Policy: the Machine is unconfined. A policy
// allowing nothing still confines (default deny). Errors name the policy
// and the field.
func Compile(policies []NamedPolicy) (*Policy, error) {
	if len(policies) == 0 {
		return nil, nil
	}
	sorted := slices.Clone(policies)
	slices.SortFunc(sorted, func(a, b NamedPolicy) int { return strings.Compare(a.Name, b.Name) })
	p := &Policy{}
	for _, np := range sorted {
		g, dns, err := compileGrant(np.Egress)
		if err != nil {
			return nil, fmt.Errorf("MachineNetworkPolicy %s: spec.egress.%v", np.Name, err)
		}
		p.DNS = append(p.DNS, dns...)
		if len(g.Nets) == 0 && len(g.FQDNs) == 0 {
			// Nothing to reach: ports, SNI or ICMP alone open nothing.
			continue
		}
		if !slices.ContainsFunc(p.Grants, func(o Grant) bool { return o.ID() == g.ID() }) {
			p.Grants = append(p.Grants, g)
		}
	}
	slices.Sort(p.DNS)
	p.DNS = slices.Compact(p.DNS)
	return p, nil
}

// allowsPort tells whether the grant allows TCP or UDP to port.
func (g Grant) allowsPort(port uint16) bool {
	if len(g.Ports) == 0 {
		return true
	}
	for _, r := range g.Ports {
		if r.Lo <= port && port <= r.Hi {
			return true
		}
	}
	return false
}
