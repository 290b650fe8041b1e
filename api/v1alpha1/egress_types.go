package v1alpha1

// EgressRules is an egress allowlist. Anything it does not allow is dropped at
// the Machine's network edge: the node agent programs nftables at the
// Machine's tap (docs/guides/egress.md). MachineClaim.spec.egress and
// MachineNetworkPolicy.spec.egress share this type so that a claim's rules
// reach the policy unchanged. Destinations come from allowCidrs and
// allowFqdns; allowPorts, allowSNI and allowIcmp say what may go to them.
type EgressRules struct {
	// AllowFqdns are host names, exact or "*.suffix", the guest may resolve
	// and connect to: the node's DNS proxy (kairon-node
	// --egress-dns-port) allows the addresses of an answer it forwarded,
	// for the answer's TTL clamped to [30s, 1h] plus a grace. An address
	// the guest did not resolve through it is not allowed.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	AllowFqdns []Hostname `json:"allowFqdns,omitempty"`

	// AllowSNI are TLS server names, an exact name or "*.suffix" for every
	// name below suffix. It restricts, never allows: a TCP connection that
	// only this policy allows must open with a TLS ClientHello naming one of
	// them, or the node's SNI proxy (kairon-node --egress-sni-port) resets
	// it. Without the proxy such TCP is dropped.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	AllowSNI []ServerName `json:"allowSNI,omitempty"`

	// AllowCidrs are destination networks the guest may reach, e.g.
	// 10.0.0.0/8. IPv6 networks are accepted; guests have no IPv6 yet, so
	// they allow nothing today. Link-local (the metadata service), multicast and the
	// guest network are reached only through a CIDR inside them.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	AllowCidrs []CIDR `json:"allowCidrs,omitempty"`

	// AllowPorts are destination ports ("443") or inclusive ranges
	// ("8000-8100"). Empty allows every port on the allowed destinations.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	AllowPorts []PortRange `json:"allowPorts,omitempty"`

	// AllowDNS are DNS query names the guest may ask about, exact or
	// "*.suffix"; other names are answered REFUSED. Empty falls back to
	// allowFqdns.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	AllowDNS []ServerName `json:"allowDNS,omitempty"`

	// AllowIcmp lets ICMP echo requests through to allowed destinations.
	// +optional
	AllowIcmp bool `json:"allowIcmp,omitempty"`
}

// Hostname is a DNS name such as pypi.org, or "*.suffix" for every name
// below suffix (not suffix itself), as Cilium's toFQDNs matchPattern.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=253
// +kubebuilder:validation:XValidation:rule="self.matches('^([*][.])?([a-zA-Z0-9]([-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?[.])*[a-zA-Z0-9]([-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?[.]?$')",message="must be a DNS host name such as pypi.org, or a wildcard suffix such as *.pythonhosted.org"
type Hostname string

// ServerName is an exact DNS name or "*.suffix".
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=253
// +kubebuilder:validation:XValidation:rule="self.matches('^([*][.])?([a-zA-Z0-9]([-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?[.])*[a-zA-Z0-9]([-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?[.]?$')",message="must be an exact DNS name (api.example.com) or a wildcard suffix (*.example.com)"
type ServerName string

// CIDR is an IPv4 or IPv6 network in CIDR notation.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=43
// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="must be a CIDR such as 10.0.0.0/8 or 2001:db8::/32"
type CIDR string

// PortRange is a port "N" or an inclusive range "N-M", each within 1-65535.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=11
// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]{1,5}(-[0-9]{1,5})?$') && self.split('-').all(p, int(p) >= 1 && int(p) <= 65535) && (size(self.split('-')) == 1 || int(self.split('-')[0]) <= int(self.split('-')[1]))",message="must be a port N or a range N-M with 1 <= N <= M <= 65535"
type PortRange string
