package rules

import (
	"fmt"
	"slices"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules/egresspolicy"
)

// EgressWithin tells whether an egress allowlist allows nothing its ceiling
// does not: every destination, port, server name, DNS name and ICMP it
// opens is open under the ceiling too. It returns nil if so, or an error
// naming the first field that reaches past the ceiling. Both are read as
// one policy each (one grant): the ceiling's ports bound the claim's, and
// so on field by field.
//
// Both sides are parsed as the node compiles them (package egresspolicy),
// and each of the claim's elements is compared with the ceiling's compiled
// grant through the matching the enforcer uses, so the ceiling and the
// node cannot read a rule differently.
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
	asked, err := egresspolicy.Parse(claim)
	if err != nil {
		return err
	}
	bounds, err := egresspolicy.Parse(ceiling)
	if err != nil {
		return fmt.Errorf("the ceiling's %v", err)
	}
	bound := bounds.Grant()
	for i, f := range asked.FQDNs {
		if !egresspolicy.AnyCovers(bound.FQDNs, f) {
			return fmt.Errorf("allowFqdns[%d] %q is not within the ceiling's allowFqdns %v", i, claim.AllowFqdns[i], ceiling.AllowFqdns)
		}
	}
	for i, n := range asked.Nets {
		if !bound.AllowsNet(n) {
			return fmt.Errorf("allowCidrs[%d] %q is not within the ceiling's allowCidrs %v", i, claim.AllowCidrs[i], ceiling.AllowCidrs)
		}
	}
	if len(bound.Ports) > 0 {
		if len(asked.Ports) == 0 {
			return fmt.Errorf("allowPorts is empty (every port) but the ceiling allows only %v", ceiling.AllowPorts)
		}
		for i, r := range asked.Ports {
			if !bound.AllowsPorts(r) {
				return fmt.Errorf("allowPorts[%d] %q is not within the ceiling's allowPorts %v", i, claim.AllowPorts[i], ceiling.AllowPorts)
			}
		}
	}
	if len(bound.SNI) > 0 {
		if len(asked.SNI) == 0 {
			return fmt.Errorf("allowSNI is empty (any TLS server name) but the ceiling allows only %v", ceiling.AllowSNI)
		}
		for i, s := range asked.SNI {
			if !egresspolicy.AnyCovers(bound.SNI, s) {
				return fmt.Errorf("allowSNI[%d] %q is not within the ceiling's allowSNI %v", i, claim.AllowSNI[i], ceiling.AllowSNI)
			}
		}
	}
	askedDNS, boundDNS := asked.QueryNames(), bounds.QueryNames()
	if i := slices.IndexFunc(askedDNS, func(d egresspolicy.Pattern) bool { return !egresspolicy.AnyCovers(boundDNS, d) }); i >= 0 {
		return fmt.Errorf("allowDNS (or allowFqdns, which it defaults to) lets the guest ask about %q, which the ceiling's %v does not", askedDNS[i], boundDNS)
	}
	if asked.ICMP && !bound.ICMP {
		return fmt.Errorf("allowIcmp is true but the ceiling does not allow ICMP")
	}
	return nil
}
