package egresspolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// Allowlist is one spec.egress parsed element by element, in the order
// written: Nets[i] is allowCidrs[i], FQDNs[i] allowFqdns[i], and so on, so
// a check over it can name the field and index the user wrote. Grant
// gives the normalized form the enforcer programs.
type Allowlist struct {
	Nets  []netip.Prefix // allowCidrs, masked
	FQDNs []Pattern      // allowFqdns
	SNI   []Pattern      // allowSNI
	Ports []PortRange    // allowPorts
	DNS   []Pattern      // allowDNS as written; see QueryNames
	ICMP  bool           // allowIcmp
}

// Parse reads e, refusing what the CRD refuses (the node must not trust
// that the API server validated). Errors name the field and index, as
// "allowPorts[1]: ...".
func Parse(e kaironv1.EgressRules) (Allowlist, error) {
	var a Allowlist
	var err error
	if a.Nets, err = parseEach("allowCidrs", e.AllowCidrs, parseCIDR); err != nil {
		return a, err
	}
	if a.FQDNs, err = parseEach("allowFqdns", e.AllowFqdns, parseWildcardable); err != nil {
		return a, err
	}
	if a.SNI, err = parseEach("allowSNI", e.AllowSNI, parseWildcardable); err != nil {
		return a, err
	}
	if a.Ports, err = parseEach("allowPorts", e.AllowPorts, parsePort); err != nil {
		return a, err
	}
	if a.DNS, err = parseEach("allowDNS", e.AllowDNS, parseWildcardable); err != nil {
		return a, err
	}
	a.ICMP = e.AllowIcmp
	return a, nil
}

// QueryNames is what the guest may ask its DNS proxy about: allowDNS, or
// allowFqdns when allowDNS is empty.
func (a Allowlist) QueryNames() []Pattern {
	if len(a.DNS) == 0 {
		return slices.Clone(a.FQDNs)
	}
	return slices.Clone(a.DNS)
}

// Grant is the allowlist normalized: networks and names sorted without
// repeats, ports sorted and merged. Two allowlists allowing the same get
// the same Grant, and so the same ID.
func (a Allowlist) Grant() Grant {
	g := Grant{
		Nets:  slices.Clone(a.Nets),
		FQDNs: slices.Clone(a.FQDNs),
		SNI:   slices.Clone(a.SNI),
		Ports: slices.Clone(a.Ports),
		ICMP:  a.ICMP,
	}
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
	return g
}

func parseEach[S ~string, T any](field string, in []S, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for i, s := range in {
		v, err := parse(string(s))
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %v", field, i, err)
		}
		out = append(out, v)
	}
	return out, nil
}

func parseCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR such as 10.0.0.0/8 or 2001:db8::/32", s)
	}
	return p.Masked(), nil
}

// parseWildcardable is parsePattern for the fields that take "*.suffix":
// all of them today.
func parseWildcardable(s string) (Pattern, error) { return parsePattern(s, true) }
