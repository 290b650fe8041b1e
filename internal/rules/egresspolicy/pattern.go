package egresspolicy

import (
	"fmt"
	"regexp"
	"strings"
)

// Pattern is a lower-case DNS name without a trailing dot, exact
// ("pkg.test") or a wildcard ("*.pkg.test", every name strictly below
// pkg.test, as Cilium's toFQDNs matchPattern).
type Pattern string

// CanonicalName is name as patterns are written: lower case, without a
// trailing dot. Names read off the wire (DNS questions and answers, TLS
// server names) go through it before they are compared with a Pattern.
func CanonicalName(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// Match tells whether name (any case, trailing dot or not) is allowed by p.
func (p Pattern) Match(name string) bool {
	name = CanonicalName(name)
	if suffix, ok := strings.CutPrefix(string(p), "*."); ok {
		return strings.HasSuffix(name, "."+suffix) && len(name) > len(suffix)+1
	}
	return name == string(p)
}

// Covers tells whether every name q matches is matched by p too: an exact
// name p matches, or a wildcard no wider than p ("*.a.test" under
// "*.test", and "*.test" under itself).
func (p Pattern) Covers(q Pattern) bool {
	if p == q {
		return true
	}
	if suffix, wild := strings.CutPrefix(string(q), "*."); wild {
		// Every name below suffix is below p's suffix exactly when
		// suffix itself is (p == q was handled above).
		return strings.HasPrefix(string(p), "*.") && p.Match(suffix)
	}
	return p.Match(string(q))
}

// AnyCovers tells whether one of patterns covers q.
func AnyCovers(patterns []Pattern, q Pattern) bool {
	for _, p := range patterns {
		if p.Covers(q) {
			return true
		}
	}
	return false
}

var labelPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// parsePattern accepts what the CRD's ServerName and Hostname accept, again:
// the agent is the last line and must not trust that the API server
// validated (an older CRD, a direct etcd write).
func parsePattern(s string, wildcard bool) (Pattern, error) {
	name := CanonicalName(s)
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
