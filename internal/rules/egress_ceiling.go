package rules

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// EgressWithin tells whether an egress allowlist allows nothing its ceiling
// does not: every destination, port, server name, DNS name and ICMP it
// opens is open under the ceiling too. It returns nil if so, or an error
// naming the first field that reaches past the ceiling. Both are read as
// one policy each (one grant): the ceiling's ports bound the claim's, and
// so on field by field.
//
// A name is within a name pattern that matches it ("pkg.test" within
// "*.test"), a wildcard within a wider one ("*.a.test" within "*.test");
// a CIDR within a CIDR that contains it. Destinations do not mix: a name
// is never within a CIDR (its addresses are not known in advance), nor a
// CIDR within names. Empty ports mean every port, so a claim without ports
// fits only a ceiling without ports. allowSNI only narrows, so a claim may
// add it freely; a ceiling with allowSNI requires the claim to name servers
// within it. allowDNS defaults to allowFqdns on both sides.
func EgressWithin(claim, ceiling kaironv1.EgressRules) error {
	for i, f := range claim.AllowFqdns {
		if !namesCover(hostnames(ceiling.AllowFqdns), string(f)) {
			return fmt.Errorf("allowFqdns[%d] %q is not within the ceiling's allowFqdns %v", i, f, ceiling.AllowFqdns)
		}
	}
	for i, c := range claim.AllowCidrs {
		p, err := netip.ParsePrefix(strings.TrimSpace(string(c)))
		if err != nil {
			return fmt.Errorf("allowCidrs[%d] %q is not a CIDR", i, c)
		}
		if !cidrsCover(ceiling.AllowCidrs, p) {
			return fmt.Errorf("allowCidrs[%d] %q is not within the ceiling's allowCidrs %v", i, c, ceiling.AllowCidrs)
		}
	}
	if len(ceiling.AllowPorts) > 0 {
		if len(claim.AllowPorts) == 0 {
			return fmt.Errorf("allowPorts is empty (every port) but the ceiling allows only %v", ceiling.AllowPorts)
		}
		for i, p := range claim.AllowPorts {
			lo, hi, err := portRange(string(p))
			if err != nil {
				return fmt.Errorf("allowPorts[%d] %q: %v", i, p, err)
			}
			if !portsCover(ceiling.AllowPorts, lo, hi) {
				return fmt.Errorf("allowPorts[%d] %q is not within the ceiling's allowPorts %v", i, p, ceiling.AllowPorts)
			}
		}
	}
	if len(ceiling.AllowSNI) > 0 {
		if len(claim.AllowSNI) == 0 {
			return fmt.Errorf("allowSNI is empty (any TLS server name) but the ceiling allows only %v", ceiling.AllowSNI)
		}
		for i, s := range claim.AllowSNI {
			if !namesCover(serverNames(ceiling.AllowSNI), string(s)) {
				return fmt.Errorf("allowSNI[%d] %q is not within the ceiling's allowSNI %v", i, s, ceiling.AllowSNI)
			}
		}
	}
	claimDNS, ceilingDNS := effectiveDNS(claim), effectiveDNS(ceiling)
	for _, d := range claimDNS {
		if !namesCover(ceilingDNS, d) {
			return fmt.Errorf("allowDNS (or allowFqdns, which it defaults to) lets the guest ask about %q, which the ceiling's %v does not", d, ceilingDNS)
		}
	}
	if claim.AllowIcmp && !ceiling.AllowIcmp {
		return fmt.Errorf("allowIcmp is true but the ceiling does not allow ICMP")
	}
	return nil
}

func hostnames(hs []kaironv1.Hostname) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = string(h)
	}
	return out
}

func serverNames(ss []kaironv1.ServerName) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}

func effectiveDNS(e kaironv1.EgressRules) []string {
	if len(e.AllowDNS) > 0 {
		return serverNames(e.AllowDNS)
	}
	return hostnames(e.AllowFqdns)
}

func canonicalName(s string) string {
	return strings.ToLower(strings.TrimSuffix(strings.TrimSpace(s), "."))
}

// namesCover tells whether name (exact or "*.suffix") is within one of
// patterns.
func namesCover(patterns []string, name string) bool {
	name = canonicalName(name)
	for _, p := range patterns {
		p = canonicalName(p)
		if p == name {
			return true
		}
		suffix, wild := strings.CutPrefix(p, "*.")
		if !wild {
			continue
		}
		// "x.suffix" and "*.x.suffix" are strictly below suffix.
		rest := strings.TrimPrefix(name, "*.")
		if strings.HasSuffix(rest, "."+suffix) && len(rest) > len(suffix)+1 {
			return true
		}
	}
	return false
}

func cidrsCover(ceiling []kaironv1.CIDR, p netip.Prefix) bool {
	p = p.Masked()
	for _, c := range ceiling {
		q, err := netip.ParsePrefix(strings.TrimSpace(string(c)))
		if err != nil {
			continue
		}
		if q.Addr().Is4() == p.Addr().Is4() && q.Bits() <= p.Bits() && q.Masked().Contains(p.Addr()) {
			return true
		}
	}
	return false
}

func portRange(s string) (uint64, uint64, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	if !isRange {
		hi = lo
	}
	l, err1 := strconv.ParseUint(lo, 10, 16)
	h, err2 := strconv.ParseUint(hi, 10, 16)
	if err1 != nil || err2 != nil || l < 1 || h < l {
		return 0, 0, fmt.Errorf("not a port N or a range N-M with 1 <= N <= M <= 65535")
	}
	return l, h, nil
}

func portsCover(ceiling []kaironv1.PortRange, lo, hi uint64) bool {
	for _, c := range ceiling {
		l, h, err := portRange(string(c))
		if err == nil && l <= lo && hi <= h {
			return true
		}
	}
	return false
}
