package egresspolicy

import (
	"fmt"
	"slices"
	"strings"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

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
		a, err := Parse(np.Egress)
		if err != nil {
			return nil, fmt.Errorf("MachineNetworkPolicy %s: spec.egress.%v", np.Name, err)
		}
		p.DNS = append(p.DNS, a.QueryNames()...)
		g := a.Grant()
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
