package egress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/zyvor/kairon/internal/node/network"
)

// Enforcement is split over two tables of the agent's network namespace,
// both named Table, next to the guest baseline's (internal/node/network):
//
//   - bridge kairon_egress drops the frames a confined guest sends to
//     another port of the bridge (another guest), but ARP and what a CIDR
//     of its policy names: everything else it sends goes to the node and
//     passes the node's IP stack;
//   - inet kairon_egress decides with conntrack, which the bridge family
//     cannot do on this kernel ("ct" in a bridge chain needs
//     nf_conntrack_bridge, which it lacks): its forward chain sends each
//     confined guest's packets (by source address, which the baseline pins
//     to the tap) to the Machine's chain, which accepts replies, what the
//     policy allows and nothing else; its nat prerouting chain sends the
//     confined guests' DNS, to whatever resolver, to the DNS proxy.
//
// Machine objects are named after the tap, unique per node, so agents
// sharing a namespace (kairon-local) never touch each other's.
const Table = "kairon_egress"

// AlwaysDenied are destinations a confined guest never reaches unless a
// CIDR of its policy names them (lies within one of them), besides the
// node and the guest networks: link-local (the cloud metadata service
// among them), multicast and broadcast.
var AlwaysDenied = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("255.255.255.255/32"),
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("fd00:ec2::254/128"),
	netip.MustParsePrefix("ff00::/8"),
}

// Machine is a confined guest as the enforcer knows it.
type Machine struct {
	Namespace, Name string
	Tap             string
	IP              netip.Addr
}

// Enforcer programs the policies of one agent's Machines.
type Enforcer struct {
	// NetNS is the namespace of the bridge (empty: the agent's own).
	NetNS string
	// Bridge carries the taps.
	Bridge string
	// Network is the guests' network and Gateway the bridge's address.
	Network netip.Prefix
	Gateway netip.Addr
	// DNSPort is where the DNS proxy listens on the node; 0 leaves DNS to
	// the policy like any other traffic.
	DNSPort uint16
	// SNIPort is where the SNI proxy listens on the node; 0: a grant
	// restricted by allowSNI allows no TCP at all (closed, not unchecked).
	SNIPort uint16
	// Masquerade, when set, is the node's uplink: what guests send out of
	// it leaves with the node's address, so that answers from networks
	// that do not route the guest network back to the node arrive.
	Masquerade string
	// MinTTL, MaxTTL and Grace bound how long a learned address stays
	// allowed: the answer's TTL clamped to [MinTTL, MaxTTL], plus Grace.
	MinTTL, MaxTTL, Grace time.Duration

	mu       sync.Mutex
	machines map[string]*applied // by tap
	byIP     map[netip.Addr]string
}

type applied struct {
	m      Machine
	policy *Policy
	script string
	// sets are the Machine's learned-address sets this agent wrote.
	sets []string
}

var (
	ifnamePattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)
	learnedSet    = regexp.MustCompile(`(?m)^\s*set (l4_([A-Za-z0-9_.-]+)_[0-9a-f]{10}) \{`)
	machineChain  = regexp.MustCompile(`(?m)^\s*chain e_([A-Za-z0-9_.-]+) \{`)
)

func (m Machine) validate() error {
	if !ifnamePattern.MatchString(m.Tap) {
		return fmt.Errorf("egress: tap name %q of Machine %s/%s is not an interface name", m.Tap, m.Namespace, m.Name)
	}
	if !m.IP.Is4() {
		return fmt.Errorf("egress: address %v of Machine %s/%s is not IPv4", m.IP, m.Namespace, m.Name)
	}
	return nil
}

func (e *Enforcer) defaults() {
	if e.MinTTL == 0 {
		e.MinTTL = 30 * time.Second
	}
	if e.MaxTTL == 0 {
		e.MaxTTL = time.Hour
	}
	if e.Grace == 0 {
		e.Grace = 5 * time.Second
	}
}

// Setup creates the shared tables and base chains (again: idempotent,
// in one transaction) and learns which Machines already have a chain, so
// that their enforcement stays in force until Apply rewrites it: an agent
// that was killed leaves its rules behind, and a restarted one converges
// without opening them.
func (e *Enforcer) Setup() error {
	e.defaults()
	if !ifnamePattern.MatchString(e.Bridge) {
		return fmt.Errorf("egress: bridge name %q is not an interface name", e.Bridge)
	}
	if e.Masquerade != "" && !ifnamePattern.MatchString(e.Masquerade) {
		return fmt.Errorf("egress: --egress-masquerade %q is not an interface name", e.Masquerade)
	}
	if !e.Network.Addr().Is4() || !e.Network.Contains(e.Gateway) {
		return fmt.Errorf("egress: gateway %v is not in the IPv4 network %v", e.Gateway, e.Network)
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return errors.New("egress: the nft command is missing: install the Debian package nftables (hack/install-deps.sh)")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.nft(e.setupScript()); err != nil {
		return err
	}
	if e.machines == nil {
		e.machines = map[string]*applied{}
		e.byIP = map[netip.Addr]string{}
	}
	// Taps confined by an earlier agent stay confined as they are until
	// Apply or Remove: their entry has no policy, so the first Apply
	// rewrites them and Remove knows to look.
	out, err := e.run("nft", "list", "table", "inet", Table)
	if err != nil {
		return err
	}
	for _, m := range machineChain.FindAllStringSubmatch(out, -1) {
		if e.machines[m[1]] == nil {
			e.machines[m[1]] = &applied{}
		}
	}
	return nil
}

func (e *Enforcer) setupScript() string {
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format+"\n", args...) }
	b := "bridge " + Table
	w("add table %s", b)
	w("add map %s egress_vmap { type ifname : verdict; }", b)
	// The forward hook sees the frames the bridge passes from one port to
	// another, not those for the node: after the baseline's (priority 0),
	// and a drop in either table is final.
	w("add chain %s forward { type filter hook forward priority 10; policy accept; }", b)
	w("flush chain %s forward", b)
	w("add rule %s forward iifname vmap @egress_vmap", b)

	i := "inet " + Table
	w("add table %s", i)
	w("add map %s egress4 { type ipv4_addr : verdict; }", i)
	w("add set %s denied4 { type ipv4_addr; flags interval; auto-merge; }", i)
	w("add chain %s forward { type filter hook forward priority 10; policy accept; }", i)
	w("flush chain %s forward", i)
	w("add rule %s forward ip saddr vmap @egress4", i)
	if e.DNSPort != 0 {
		// One chain and set per proxy port: agents sharing the namespace
		// (kairon-local) each have their own proxy. Before the usual dstnat
		// (-100), so that no other DNAT of the node (kube-proxy) takes a
		// confined guest's DNS elsewhere first.
		w("add set %s %s { type ipv4_addr; }", i, e.dnsSet())
		w("add chain %s %s { type nat hook prerouting priority -110; policy accept; }", i, e.dnsSet())
		w("flush chain %s %s", i, e.dnsSet())
		w("add rule %s %s ip saddr @%s meta l4proto { tcp, udp } th dport 53 redirect to :%d", i, e.dnsSet(), e.dnsSet(), e.DNSPort)
	}
	if e.SNIPort != 0 {
		// As the DNS proxy's: one map and chain per proxy port. A map
		// entry sends a guest's new connections to its own nat chain,
		// which redirects those its allowSNI grants must check.
		w("add map %s %s { type ipv4_addr : verdict; }", i, e.sniMap())
		w("add chain %s %s { type nat hook prerouting priority -110; policy accept; }", i, e.sniMap())
		w("flush chain %s %s", i, e.sniMap())
		w("add rule %s %s meta l4proto tcp ip saddr vmap @%s", i, e.sniMap(), e.sniMap())
	}
	if e.Masquerade != "" {
		// One chain per uplink, as the proxy's: agents sharing the
		// namespace may name different ones.
		c := "masq_" + e.Masquerade
		w("add chain %s %s { type nat hook postrouting priority 100; policy accept; }", i, c)
		w("flush chain %s %s", i, c)
		w("add rule %s %s oifname %q ip saddr %s masquerade", i, c, e.Masquerade, e.Network.Masked())
	}
	var denied []string
	for _, p := range append([]netip.Prefix{e.Network.Masked()}, AlwaysDenied...) {
		if p.Addr().Is4() {
			denied = append(denied, p.String())
		}
	}
	w("add element %s denied4 { %s }", i, strings.Join(denied, ", "))
	return s.String()
}

// explicit tells whether a policy CIDR lies within an always-denied range
// (or the guest network): naming such a range is the only way in.
func (e *Enforcer) explicit(p netip.Prefix) bool {
	for _, d := range append([]netip.Prefix{e.Network.Masked()}, AlwaysDenied...) {
		if d.Addr().Is4() == p.Addr().Is4() && d.Bits() <= p.Bits() && d.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

func learnedSetName(tap, grantID string) string { return "l4_" + tap + "_" + grantID }

// l4 is the transport match of a grant in the filter chain: its ports for
// TCP and UDP, or every protocol but ICMP. A grant restricted by SNI
// allows no TCP here: its connections go to the SNI proxy in the nat chain
// and never reach this chain, and without the proxy (SNIPort 0) they are
// closed rather than unchecked.
func l4(g Grant) string {
	protos := "{ tcp, udp }"
	if len(g.SNI) > 0 {
		protos = "udp"
	}
	if len(g.Ports) == 0 {
		if len(g.SNI) > 0 {
			return "meta l4proto udp"
		}
		return "meta l4proto != { icmp, ipv6-icmp }"
	}
	ports := make([]string, len(g.Ports))
	for i, p := range g.Ports {
		ports[i] = p.String()
	}
	return fmt.Sprintf("meta l4proto %s th dport { %s }", protos, strings.Join(ports, ", "))
}

func nets4(nets []netip.Prefix, explicit func(netip.Prefix) bool, want bool) string {
	var out []string
	for _, n := range nets {
		if n.Addr().Is4() && explicit(n) == want {
			out = append(out, n.String())
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "{ " + strings.Join(out, ", ") + " }"
}

// machineScript writes m's chains, its learned sets (kept if they exist:
// an unchanged grant keeps what its guest resolved) and its map entries,
// and deletes the learned sets of grants it no longer has.
func (e *Enforcer) machineScript(m Machine, p *Policy, staleSets []string) string {
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format+"\n", args...) }
	b := "bridge " + Table
	i := "inet " + Table
	tap := m.Tap

	w("add chain %s e_%s", b, tap)
	w("flush chain %s e_%s", b, tap)
	for _, g := range p.Grants {
		if set := nets4(g.Nets, e.explicit, true); set != "" {
			w("add rule %s e_%s ip daddr %s accept", b, tap, set)
		}
	}
	w("add rule %s e_%s ether type arp accept", b, tap)
	w("add rule %s e_%s drop", b, tap)

	w("add chain %s e_%s", i, tap)
	w("flush chain %s e_%s", i, tap)
	for _, g := range p.Grants {
		if len(g.FQDNs) > 0 {
			// Bounded: a full set refuses the answer (SERVFAIL) rather
			// than grow with whatever a guest resolves.
			w("add set %s %s { type ipv4_addr; size 4096; flags timeout; }", i, learnedSetName(tap, g.ID()))
		}
	}
	for _, r := range DenyReasons {
		w("add counter %s %s", i, counterName(tap, r))
		// The destinations dropped in the last minute, a few of them, for
		// the Machine's Warning event (DeniedDestinations).
		w("add set %s %s { type ipv4_addr . inet_proto . inet_service; size %d; flags dynamic,timeout; timeout %ds; }", i, recentName(tap, r), recentSize, int(recentWindow/time.Second))
	}
	// deny drops what match matches, counting it under reason and
	// recording its destination. The record is a rule of its own: adding
	// to a full set fails the rule, which must not spare the packet.
	deny := func(match, reason string) {
		w("add rule %s e_%s %s add @%s { ip daddr . meta l4proto . th dport }", i, tap, match, recentName(tap, reason))
		w("add rule %s e_%s %s counter name %q drop", i, tap, match, counterName(tap, reason))
	}
	w("add rule %s e_%s ct state established,related accept", i, tap)
	rules := func(explicit bool) {
		for _, g := range p.Grants {
			var dests []string
			if set := nets4(g.Nets, e.explicit, explicit); set != "" {
				dests = append(dests, set)
			}
			if !explicit && len(g.FQDNs) > 0 {
				dests = append(dests, "@"+learnedSetName(tap, g.ID()))
			}
			for _, d := range dests {
				w("add rule %s e_%s ip daddr %s %s accept", i, tap, d, l4(g))
				if g.ICMP {
					w("add rule %s e_%s ip daddr %s icmp type echo-request accept", i, tap, d)
				}
			}
		}
	}
	rules(true)
	deny("ip daddr @denied4", ReasonIP)
	rules(false)
	// What no grant accepted, by why, for kairon_egress_denied_total.
	deny("meta l4proto { icmp, ipv6-icmp }", ReasonICMP)
	for _, g := range p.Grants {
		var dests []string
		if set := nets4(g.Nets, func(netip.Prefix) bool { return true }, true); set != "" {
			dests = append(dests, set)
		}
		if len(g.FQDNs) > 0 {
			dests = append(dests, "@"+learnedSetName(tap, g.ID()))
		}
		for _, d := range dests {
			deny("ip daddr "+d, ReasonPort)
		}
	}
	deny("meta nfproto ipv4", ReasonIP)
	// Only IPv4 reaches this chain (the map is by IPv4 source); anything
	// else is dropped all the same rather than fall back to the base
	// chain's accept.
	w("add rule %s e_%s drop", i, tap)

	if e.SNIPort != 0 {
		s.WriteString(e.sniScript(m, p))
	}
	// Last: until both chains are rewritten, their old rules refer to
	// these sets, and the kernel refuses to delete a set in use.
	for _, set := range staleSets {
		w("delete set %s %s", i, set)
	}
	w("add element %s egress_vmap { %q : goto e_%s }", b, tap, tap)
	w("add element %s egress4 { %s : goto e_%s }", i, m.IP, tap)
	if e.DNSPort != 0 {
		w("add element %s %s { %s }", i, e.dnsSet(), m.IP)
	}
	return s.String()
}

// sniScript writes m's nat chain: the TCP connections that only a grant
// with allowSNI allows go to the SNI proxy; those another grant allows
// without it pass on to the filter (union: a name check is a restriction
// of its own grant, never of another's). The chain follows the filter
// chain's order, so that what the filter drops is never redirected.
func (e *Enforcer) sniScript(m Machine, p *Policy) string {
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format+"\n", args...) }
	i := "inet " + Table
	tap := m.Tap
	w("add chain %s s_%s", i, tap)
	w("flush chain %s s_%s", i, tap)
	// Out of the map first (added so that the delete cannot fail): a
	// policy without allowSNI leaves no entry behind.
	w("add element %s %s { %s : goto s_%s }", i, e.sniMap(), m.IP, tap)
	w("delete element %s %s { %s }", i, e.sniMap(), m.IP)
	checked := slices.ContainsFunc(p.Grants, func(g Grant) bool { return len(g.SNI) > 0 })
	if !checked {
		return s.String()
	}
	rules := func(explicit bool) {
		for _, sni := range []bool{false, true} {
			for _, g := range p.Grants {
				if (len(g.SNI) > 0) != sni {
					continue
				}
				var dests []string
				if set := nets4(g.Nets, e.explicit, explicit); set != "" {
					dests = append(dests, set)
				}
				if !explicit && len(g.FQDNs) > 0 {
					dests = append(dests, "@"+learnedSetName(tap, g.ID()))
				}
				verdict := "return"
				if sni {
					verdict = fmt.Sprintf("redirect to :%d", e.SNIPort)
				}
				for _, d := range dests {
					w("add rule %s s_%s ip daddr %s %s %s", i, tap, d, tcpPorts(g), verdict)
				}
			}
		}
	}
	rules(true)
	w("add rule %s s_%s ip daddr @denied4 return", i, tap)
	rules(false)
	w("add element %s %s { %s : goto s_%s }", i, e.sniMap(), m.IP, tap)
	return s.String()
}

// tcpPorts matches the TCP a grant allows.
func tcpPorts(g Grant) string {
	if len(g.Ports) == 0 {
		return "meta l4proto tcp"
	}
	ports := make([]string, len(g.Ports))
	for i, p := range g.Ports {
		ports[i] = p.String()
	}
	return fmt.Sprintf("tcp dport { %s }", strings.Join(ports, ", "))
}

// sniMap sends confined guests' new TCP connections to their nat chain;
// the base chain redirecting through it has the same name.
func (e *Enforcer) sniMap() string { return fmt.Sprintf("sni_%d", e.SNIPort) }

// serverNamesFor lists the server names that m may open a TLS connection
// to dst with: those of the allowSNI grants whose destination and port
// match. The nat chain redirected the connection only if one did.
func (e *Enforcer) serverNamesFor(m Machine, p *Policy, dst netip.AddrPort) []Pattern {
	denied := slices.ContainsFunc(append([]netip.Prefix{e.Network.Masked()}, AlwaysDenied...), func(d netip.Prefix) bool { return d.Contains(dst.Addr()) })
	var names []Pattern
	for _, g := range p.Grants {
		if len(g.SNI) == 0 || !g.allowsPort(dst.Port()) {
			continue
		}
		match := slices.ContainsFunc(g.Nets, func(n netip.Prefix) bool {
			return n.Contains(dst.Addr()) && (!denied || e.explicit(n))
		})
		if !match && !denied && len(g.FQDNs) > 0 {
			match = e.learned(m.Tap, g.ID(), dst.Addr())
		}
		if match {
			names = append(names, g.SNI...)
		}
	}
	return names
}

// learned tells whether ip is in a grant's learned set now.
func (e *Enforcer) learned(tap, grantID string, ip netip.Addr) bool {
	if !ip.Is4() {
		return false
	}
	_, err := e.run("nft", "get", "element", "inet", Table, learnedSetName(tap, grantID), "{", ip.String(), "}")
	return err == nil
}

// dnsSet holds the confined guests whose DNS goes to this agent's proxy;
// the chain redirecting it has the same name.
func (e *Enforcer) dnsSet() string { return fmt.Sprintf("dns_%d", e.DNSPort) }

// forgetAddress takes ip's entries out. The egress4 entry goes only if it
// points at tap's chain (owner is the tap it points at in the kernel): in
// kairon-local a migration's source and target share the namespace and
// the guest's address, and the entry may be the other agent's by now.
func (e *Enforcer) forgetAddress(tap string, ip netip.Addr, owner string) string {
	i := "inet " + Table
	var s string
	if owner == tap {
		s = fmt.Sprintf("delete element %s egress4 { %s }\n", i, ip)
	}
	if e.DNSPort != 0 {
		s += fmt.Sprintf("add element %[1]s %[2]s { %[3]s }\ndelete element %[1]s %[2]s { %[3]s }\n", i, e.dnsSet(), ip)
	}
	if e.SNIPort != 0 {
		// This agent's own map, as the DNS set: never another tap's entry.
		s += fmt.Sprintf("add chain %[1]s s_%[4]s\nadd element %[1]s %[2]s { %[3]s : goto s_%[4]s }\ndelete element %[1]s %[2]s { %[3]s }\n", i, e.sniMap(), ip, tap)
	}
	return s
}

// removeScript takes out everything of tap and address ip. Each object is
// added before it is deleted (nft 1.0.6 has no "destroy"), so the script
// succeeds whatever is left.
func (e *Enforcer) removeScript(tap string, ip netip.Addr, owner string, sets []string) string {
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format+"\n", args...) }
	b := "bridge " + Table
	i := "inet " + Table
	w("add chain %s e_%s", b, tap)
	w("add element %s egress_vmap { %q : goto e_%s }", b, tap, tap)
	w("delete element %s egress_vmap { %q }", b, tap)
	w("flush chain %s e_%s", b, tap)
	w("delete chain %s e_%s", b, tap)
	w("add chain %s e_%s", i, tap)
	if ip.IsValid() {
		s.WriteString(e.forgetAddress(tap, ip, owner))
	}
	w("flush chain %s e_%s", i, tap)
	w("delete chain %s e_%s", i, tap)
	w("add chain %s s_%s", i, tap)
	w("flush chain %s s_%s", i, tap)
	w("delete chain %s s_%s", i, tap)
	for _, set := range sets {
		w("delete set %s %s", i, set)
	}
	for _, r := range DenyReasons {
		w("add counter %s %s", i, counterName(tap, r))
		w("delete counter %s %s", i, counterName(tap, r))
		w("add set %s %s { type ipv4_addr . inet_proto . inet_service; size %d; flags dynamic,timeout; timeout %ds; }", i, recentName(tap, r), recentSize, int(recentWindow/time.Second))
		w("delete set %s %s", i, recentName(tap, r))
	}
	return s.String()
}

// setsOf lists tap's learned sets in the kernel.
func (e *Enforcer) setsOf(tap string) ([]string, error) {
	out, err := e.run("nft", "list", "table", "inet", Table)
	if err != nil {
		return nil, err
	}
	var sets []string
	for _, m := range learnedSet.FindAllStringSubmatch(out, -1) {
		if m[2] == tap {
			sets = append(sets, m[1])
		}
	}
	return sets, nil
}

// Apply confines m to p, or lifts its confinement when p is nil. It
// rewrites m's rules in one transaction: there is no moment without them.
func (e *Enforcer) Apply(m Machine, p *Policy) error {
	if err := m.validate(); err != nil {
		return err
	}
	if p == nil {
		return e.Remove(m.Tap)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.machines == nil {
		return errors.New("egress: Setup was not called")
	}
	if old := e.machines[m.Tap]; old != nil && old.m.IP == m.IP && old.script == e.machineScript(m, p, nil) {
		return nil
	}
	keep := learnedSets(m.Tap, p)
	if old := e.machines[m.Tap]; old == nil || (old.policy != nil && old.m.IP == m.IP) {
		// The common case, a new Machine or a new policy at the same
		// address: the kernel holds what this agent wrote, so one
		// transaction without reading it first. If another tap holds the
		// address (the other end of a migration in a shared namespace),
		// the kernel refuses the map entry and the careful path below
		// looks.
		var stale []string
		if old != nil {
			stale = slices.DeleteFunc(slices.Clone(old.sets), func(set string) bool { return slices.Contains(keep, set) })
		}
		script := lean(e.machineScript(m, p, stale), old == nil, old == nil || !hasSNI(old.policy))
		if err := e.nft(script); err == nil {
			e.record(m, p, keep)
			return nil
		}
	}
	owners, err := e.owners()
	if err != nil {
		return err
	}
	var before, moved string
	if o, ok := owners[m.IP]; ok && o != m.Tap {
		// Another tap's entry for this address (the other end of a
		// migration in a shared namespace): ours replaces it.
		before = fmt.Sprintf("delete element inet %s egress4 { %s }\n", Table, m.IP)
	}
	if old := e.machines[m.Tap]; old != nil && old.m.IP.IsValid() && old.m.IP != m.IP {
		// The address changed: the old one's entries go in the same
		// transaction as the new ones come, so the tap is never open.
		moved = e.forgetAddress(m.Tap, old.m.IP, owners[old.m.IP])
		delete(e.byIP, old.m.IP)
	}
	existing, err := e.setsOf(m.Tap)
	if err != nil {
		return err
	}
	stale := slices.DeleteFunc(existing, func(set string) bool { return slices.Contains(keep, set) })
	if err := e.nft(before + e.machineScript(m, p, stale) + moved); err != nil {
		return err
	}
	e.record(m, p, keep)
	return nil
}

// lean drops from a Machine's script what a transaction need not do when
// this agent knows the kernel's state, since flushing a chain and deleting
// a set element make the kernel's commit several times slower (a
// Machine's script: 10 ms bare, 28 ms with them, on this project's test
// hosts). fresh: the Machine has no chain yet, so nothing to flush, and
// its chains are created with "create", which fails (and so sends Apply
// down its careful path) if they exist after all. noSNIEntry: the SNI map
// holds no entry for the address, so the defensive add-and-delete of one
// goes.
func lean(script string, fresh, noSNIEntry bool) string {
	lines := strings.SplitAfter(script, "\n")
	var out strings.Builder
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch {
		case fresh && strings.HasPrefix(l, "flush chain "):
			continue
		case fresh && strings.HasPrefix(l, "add chain "):
			l = "create chain " + strings.TrimPrefix(l, "add chain ")
		case noSNIEntry && strings.HasPrefix(l, "add element inet "+Table+" sni_") && i+1 < len(lines) &&
			strings.HasPrefix(lines[i+1], "delete element inet "+Table+" sni_"):
			i++ // and its delete
			continue
		}
		out.WriteString(l)
	}
	return out.String()
}

func hasSNI(p *Policy) bool {
	return p != nil && slices.ContainsFunc(p.Grants, func(g Grant) bool { return len(g.SNI) > 0 })
}

// record notes what Apply wrote for m.
func (e *Enforcer) record(m Machine, p *Policy, sets []string) {
	e.machines[m.Tap] = &applied{m: m, policy: p, script: e.machineScript(m, p, nil), sets: sets}
	e.byIP[m.IP] = m.Tap
}

// learnedSets names the learned-address sets of tap under p.
func learnedSets(tap string, p *Policy) []string {
	var sets []string
	for _, g := range p.Grants {
		if len(g.FQDNs) > 0 {
			sets = append(sets, learnedSetName(tap, g.ID()))
		}
	}
	return sets
}

// Remove takes out every object of tap: chains, map entries, learned sets.
func (e *Enforcer) Remove(tap string) error {
	if !ifnamePattern.MatchString(tap) {
		return fmt.Errorf("egress: tap name %q is not an interface name", tap)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	a, ok := e.machines[tap]
	if !ok {
		// Neither applied by this agent nor found at Setup.
		return nil
	}
	ip := a.m.IP
	if !ip.IsValid() {
		var err error
		if ip, err = e.addressInKernel(tap); err != nil {
			return err
		}
	}
	sets, err := e.setsOf(tap)
	if err != nil {
		return err
	}
	owners, err := e.owners()
	if err != nil {
		return err
	}
	if err := e.nft(e.removeScript(tap, ip, owners[ip], sets)); err != nil {
		return err
	}
	delete(e.machines, tap)
	delete(e.byIP, ip)
	return nil
}

var egressEntry = regexp.MustCompile(`([0-9.]+) : goto e_([A-Za-z0-9_.-]+)`)

// owners maps each address in egress4 to the tap whose chain it points at.
func (e *Enforcer) owners() (map[netip.Addr]string, error) {
	out, err := e.run("nft", "list", "map", "inet", Table, "egress4")
	if err != nil {
		return nil, err
	}
	owners := map[netip.Addr]string{}
	for _, m := range egressEntry.FindAllStringSubmatch(out, -1) {
		if ip, err := netip.ParseAddr(m[1]); err == nil {
			owners[ip] = m[2]
		}
	}
	return owners, nil
}

// addressInKernel finds the address whose map entry points to tap's chain:
// a restarted agent removes what its predecessor left.
func (e *Enforcer) addressInKernel(tap string) (netip.Addr, error) {
	out, err := e.run("nft", "list", "map", "inet", Table, "egress4")
	if err != nil {
		return netip.Addr{}, err
	}
	for _, m := range egressEntry.FindAllStringSubmatch(out, -1) {
		if m[2] == tap {
			return netip.ParseAddr(m[1])
		}
	}
	return netip.Addr{}, nil
}

// Confined lists the taps with an egress chain in the namespace, any
// agent's, sorted.
func (e *Enforcer) Confined() ([]string, error) {
	out, err := e.run("nft", "list", "table", "inet", Table)
	if err != nil {
		return nil, err
	}
	var taps []string
	for _, m := range machineChain.FindAllStringSubmatch(out, -1) {
		taps = append(taps, m[1])
	}
	sort.Strings(taps)
	return taps, nil
}

// Lookup finds the confined Machine that has address ip, and its policy.
func (e *Enforcer) Lookup(ip netip.Addr) (Machine, *Policy, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	tap, ok := e.byIP[ip.Unmap()]
	if !ok {
		return Machine{}, nil, false
	}
	a := e.machines[tap]
	return a.m, a.policy, a.policy != nil
}

// TTL is how long an address learned from an answer with ttl stays
// allowed.
func (e *Enforcer) TTL(ttl time.Duration) time.Duration {
	return min(max(ttl, e.MinTTL), e.MaxTTL) + e.Grace
}

// Learn allows the guest at ip to reach addrs for ttl (clamped, see TTL)
// through every grant whose allowFqdns covers name. It returns once the
// kernel has them, so that the answer can go back to the guest.
func (e *Enforcer) Learn(ip netip.Addr, name string, addrs []netip.Addr, ttl time.Duration) error {
	e.mu.Lock()
	tap, ok := e.byIP[ip.Unmap()]
	var p *Policy
	if ok {
		p = e.machines[tap].policy
	}
	e.mu.Unlock()
	if p == nil {
		return fmt.Errorf("egress: no confined Machine has address %v", ip)
	}
	var v4 []string
	for _, a := range addrs {
		if a = a.Unmap(); a.Is4() {
			v4 = append(v4, a.String())
		}
	}
	ids := p.LearnFor(name)
	if len(ids) == 0 || len(v4) == 0 {
		return nil
	}
	secs := int(e.TTL(ttl).Round(time.Second) / time.Second)
	var s strings.Builder
	for _, id := range ids {
		set := fmt.Sprintf("inet %s %s", Table, learnedSetName(tap, id))
		elems := strings.Join(v4, ", ")
		var timed []string
		for _, a := range v4 {
			timed = append(timed, fmt.Sprintf("%s timeout %ds", a, secs))
		}
		// An element's timeout is not renewed by adding it again: add
		// (so that the delete cannot fail), delete, add with the new one.
		fmt.Fprintf(&s, "add element %s { %s }\n", set, elems)
		fmt.Fprintf(&s, "delete element %s { %s }\n", set, elems)
		fmt.Fprintf(&s, "add element %s { %s }\n", set, strings.Join(timed, ", "))
	}
	return e.nft(s.String())
}

// DefaultRouteInterface is the interface of netns's (empty: the caller's)
// IPv4 default route: the uplink to masquerade on by default.
func DefaultRouteInterface(netns string) (string, error) {
	e := &Enforcer{NetNS: netns}
	out, err := e.run("ip", "-4", "-o", "route", "show", "default")
	if err != nil {
		return "", err
	}
	f := strings.Fields(out)
	for i := range f {
		if f[i] == "dev" && i+1 < len(f) && ifnamePattern.MatchString(f[i+1]) {
			return f[i+1], nil
		}
	}
	return "", fmt.Errorf("egress: no IPv4 default route in netns %q to masquerade on: name the interface with --egress-masquerade", netns)
}

// RemoveTables deletes both egress tables of netns (empty: the caller's),
// for when the node network is torn down. Missing tables are not an
// error.
func RemoveTables(netns string) error {
	e := &Enforcer{NetNS: netns}
	var script strings.Builder
	for _, family := range []string{"bridge", "inet"} {
		fmt.Fprintf(&script, "add table %s %s\ndelete table %s %s\n", family, Table, family, Table)
	}
	return e.nft(script.String())
}

// exec runs cmd in the enforcer's namespace. A child starts in the
// network namespace of the thread that forks it, so cmd is started from a
// thread moved into NetNS (see inNetNS): one process, where `ip netns
// exec` would add a second and a mount namespace, on the path of every
// bind with egress and every DNS answer.
func (e *Enforcer) exec(cmd *exec.Cmd) error {
	if e.NetNS == "" {
		return cmd.Run()
	}
	return inNetNS(e.NetNS, cmd.Run)
}

// nft runs script as one transaction: all of it or nothing.
func (e *Enforcer) nft(script string) error {
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := e.exec(cmd); err != nil {
		return fmt.Errorf("egress: nft -f (netns %q): %v: %s", e.NetNS, err, strings.TrimSpace(out.String()))
	}
	return nil
}

func (e *Enforcer) run(args ...string) (string, error) {
	cmd := exec.Command(args[0], args[1:]...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := e.exec(cmd)
	out := buf.Bytes()
	if err != nil {
		return "", fmt.Errorf("egress: %s (netns %q): %v: %s", strings.Join(args, " "), e.NetNS, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Repair writes everything again if the tables, their base rules, or a
// chain or map entry of a Machine this agent confined are gone: something
// flushed the ruleset. Learned addresses are lost with it; the guest
// resolves again. It reports whether it had to.
func (e *Enforcer) Repair() (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.machines == nil {
		return false, errors.New("egress: Setup was not called")
	}
	bridgeTable, errBridge := e.run("nft", "list", "table", "bridge", Table)
	inetTable, errInet := e.run("nft", "list", "table", "inet", Table)
	if errBridge == nil && errInet == nil && e.intact(bridgeTable, inetTable) {
		return false, nil
	}
	var script strings.Builder
	script.WriteString(e.setupScript())
	for tap, a := range e.machines {
		if a.policy == nil {
			// Found at Setup, never written by this agent: the next Apply
			// writes it.
			delete(e.machines, tap)
			continue
		}
		// The learned sets are gone or not; creating them is idempotent.
		script.WriteString(e.machineScript(a.m, a.policy, nil))
	}
	return true, e.nft(script.String())
}

func (e *Enforcer) intact(bridgeTable, inetTable string) bool {
	for _, w := range []string{"iifname vmap @egress_vmap"} {
		if !strings.Contains(bridgeTable, w) {
			return false
		}
	}
	for _, w := range []string{"ip saddr vmap @egress4"} {
		if !strings.Contains(inetTable, w) {
			return false
		}
	}
	if e.DNSPort != 0 && !strings.Contains(inetTable, fmt.Sprintf("redirect to :%d", e.DNSPort)) {
		return false
	}
	if e.SNIPort != 0 && !strings.Contains(inetTable, fmt.Sprintf("ip saddr vmap @%s", e.sniMap())) {
		return false
	}
	if e.Masquerade != "" && !strings.Contains(inetTable, fmt.Sprintf("oifname %q ip saddr %s masquerade", e.Masquerade, e.Network.Masked())) {
		return false
	}
	for tap, a := range e.machines {
		if a.policy == nil {
			continue
		}
		for _, table := range []string{bridgeTable, inetTable} {
			if !strings.Contains(table, "chain e_"+tap+" {") || !strings.Contains(table, "goto e_"+tap) {
				return false
			}
		}
		// Any tap's entry: in a shared namespace the other end of a
		// migration may hold the address.
		if !strings.Contains(inetTable, a.m.IP.String()+" : goto e_") {
			return false
		}
	}
	return true
}

// Keep calls Repair every interval until ctx ends: between a flush and the
// next look, confined guests are unconfined.
func (e *Enforcer) Keep(ctx context.Context, interval time.Duration, logger func(error, string)) error {
	return network.KeepRepaired(ctx, interval, "the egress rules", e.Repair, logger)
}

// Reasons a confined guest's packet is dropped, the reason label of
// kairon_egress_denied_total: the destination is allowed by no grant
// (ip, also the always-denied ranges), a grant allows the destination but
// not the port or protocol (port), ICMP to no ICMP-allowing grant (icmp).
// The DNS proxy counts refused names (dns), the SNI proxy reset
// connections (sni).
const (
	ReasonIP   = "ip"
	ReasonPort = "port"
	ReasonICMP = "icmp"
	ReasonDNS  = "dns"
	ReasonSNI  = "sni"
)

// DenyReasons are the reasons counted in nftables.
var DenyReasons = []string{ReasonIP, ReasonPort, ReasonICMP}

func counterName(tap, reason string) string { return "d_" + tap + "_" + reason }

var counterPattern = regexp.MustCompile(`counter d_([A-Za-z0-9_.-]+)_(ip|port|icmp) \{\s*packets (\d+)`)

// Denied is how many packets of each confined Machine this agent knows
// were dropped, by reason.
type Denied struct {
	Machine Machine
	Reason  string
	Packets uint64
}

// DeniedCounts reads the drop counters of the Machines this agent
// confined.
func (e *Enforcer) DeniedCounts() ([]Denied, error) {
	out, err := e.run("nft", "list", "counters", "table", "inet", Table)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var ds []Denied
	for _, m := range counterPattern.FindAllStringSubmatch(out, -1) {
		a := e.machines[m[1]]
		if a == nil || a.policy == nil {
			continue
		}
		n, err := strconv.ParseUint(m[3], 10, 64)
		if err != nil {
			continue
		}
		ds = append(ds, Denied{Machine: a.m, Reason: m[2], Packets: n})
	}
	return ds, nil
}

// recentWindow is how long a dropped destination stays in its Machine's
// record, and recentSize how many the record holds: enough to name the
// first of each minute in an event.
const (
	recentWindow = time.Minute
	recentSize   = 16
)

func recentName(tap, reason string) string { return "dd_" + tap + "_" + reason }

var recentElement = regexp.MustCompile(`([0-9.]+) \. ([a-z0-9-]+) \. ([0-9]+)(?: timeout \S+)? expires ((?:[0-9]+[a-z]+)+)`)
var recentSetPattern = regexp.MustCompile(`(?m)^\s*set dd_([A-Za-z0-9_.-]+)_(ip|port|icmp) \{`)

// DeniedDestination is a destination a confined Machine was refused.
type DeniedDestination struct {
	Machine  Machine
	Reason   string
	Address  netip.Addr
	Protocol string // tcp, udp, icmp, or the protocol number
	Port     uint16 // for tcp and udp
	// Age is how long ago the packet was dropped (within recentWindow,
	// to the precision of the kernel's timeout).
	Age time.Duration
}

func (d DeniedDestination) String() string {
	if d.Protocol == "tcp" || d.Protocol == "udp" {
		return fmt.Sprintf("%s %s", d.Protocol, netip.AddrPortFrom(d.Address, d.Port))
	}
	return d.Protocol + " " + d.Address.String()
}

// DeniedDestinations lists what the Machines this agent confined were
// refused within the last recentWindow, oldest first.
func (e *Enforcer) DeniedDestinations() ([]DeniedDestination, error) {
	out, err := e.run("nft", "list", "table", "inet", Table)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var ds []DeniedDestination
	starts := recentSetPattern.FindAllStringSubmatchIndex(out, -1)
	for k, loc := range starts {
		tap, reason := out[loc[2]:loc[3]], out[loc[4]:loc[5]]
		a := e.machines[tap]
		if a == nil || a.policy == nil {
			continue
		}
		end := len(out)
		if k+1 < len(starts) {
			end = starts[k+1][0]
		}
		body := out[loc[1]:end]
		if j := strings.Index(body, "\n\t}"); j >= 0 {
			body = body[:j]
		}
		for _, m := range recentElement.FindAllStringSubmatch(body, -1) {
			ip, err1 := netip.ParseAddr(m[1])
			port, err2 := strconv.ParseUint(m[3], 10, 16)
			left, err3 := time.ParseDuration(m[4])
			if err1 != nil || err2 != nil || err3 != nil {
				continue
			}
			d := DeniedDestination{Machine: a.m, Reason: reason, Address: ip, Protocol: m[2], Port: uint16(port), Age: max(recentWindow-left, 0)}
			if d.Protocol != "tcp" && d.Protocol != "udp" {
				d.Port = 0
			}
			ds = append(ds, d)
		}
	}
	sort.SliceStable(ds, func(i, j int) bool { return ds[i].Age > ds[j].Age })
	return ds, nil
}
