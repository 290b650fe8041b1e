// Package egresspolicy is what an egress allowlist (a MachineNetworkPolicy's
// or a claim's spec.egress) means, decided once and needing no nftables:
//
//   - pattern.go: Pattern, a DNS name or "*.suffix", how a name is
//     canonicalized and matched, and when one pattern covers another;
//   - port_range.go: PortRange, parsing "N" and "N-M", merging ranges;
//   - allowlist.go: Parse, one spec.egress read element by element in the
//     order written, so errors can name the field and index;
//   - grant.go: Grant, what one policy allows, and what it lets through
//     (a port, a range of ports, a network, a name);
//   - policy.go: Compile, the union of the policies selecting a Machine,
//     and the DNS questions and learned addresses it allows.
//
// The node's enforcer (internal/node/egress) programs the compiled Policy
// into nftables and its DNS and SNI proxies match names with Pattern; the
// MCP server's egress ceiling (rules.EgressWithin) compares a claim with
// the ceiling through the same parsing and matching, so the two cannot
// disagree on what a rule allows.
package egresspolicy
