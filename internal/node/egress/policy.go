package egress

import "github.com/zyvor/kairon/internal/rules/egresspolicy"

// The enforcer programs what package egresspolicy compiled; these are its
// types under the names the enforcer, the proxies and the agent use.
type (
	Policy    = egresspolicy.Policy
	Grant     = egresspolicy.Grant
	Pattern   = egresspolicy.Pattern
	PortRange = egresspolicy.PortRange
)

// canonicalName is how the DNS and SNI proxies read names off the wire:
// as the patterns they are matched against are written.
func canonicalName(name string) string { return egresspolicy.CanonicalName(name) }
