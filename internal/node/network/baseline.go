package network

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// The baseline is the firewall every guest gets, with or without a policy
// (docs/guides/networking.md). It lives in two nftables tables of the
// agent's network namespace:
//
//   - bridge kairon: what a tap may send (its Machine's MAC and IPv4, ARP
//     included; nothing but IPv4 and ARP), which taps may talk to each
//     other (same Kubernetes namespace only), and what the host routes
//     onto a tap from a guest address (another node's guest, or one of
//     this bridge sent through the gateway) only from guests of the tap's
//     own namespace;
//   - inet kairon: nothing from a guest reaches the node's own stack (any
//     local address) but ICMP echo to a gateway and the replies of
//     connections the node opened. The bridge family cannot tell which
//     addresses are local, the inet input hook sees only what is.
//
// Every guest is also kept from the cloud metadata addresses (unless the
// node allows them) and gets nothing but IPv4 and ARP from the host.
//
// Several agents may share the namespace and the bridge (kairon-local):
// the tables, the sets every agent adds the same elements to and the base
// chains are shared and created idempotently. What differs between agents
// is never shared: a Machine's own objects are named after its tap, which
// is unique per node, and a namespace's guest addresses are one set per
// agent (named after its node), of which the namespace's chain peers_<ns>
// takes the union; so an agent adds and removes only its own, each in one
// atomic nft transaction, and no agent's write removes another's.
const (
	// BaselineTable names both tables.
	BaselineTable = "kairon"
	// TapPrefix starts every tap name (TapName); a frame from a tap of
	// that name without a baseline is dropped.
	TapPrefix = "kt"
)

// Guest is what the baseline pins a Machine's tap to.
type Guest struct {
	Tap       string
	Namespace string
	MAC       string
	IP        netip.Addr
}

// Baseline applies the guest network baseline in one network namespace.
type Baseline struct {
	// NetNS is the namespace of the bridge (empty: the agent's own).
	NetNS string
	// Bridge is the bridge the taps are on.
	Bridge string
	// Network is the guests' network and Gateway the bridge's address in
	// it: the only address of the network the host sends to guests from.
	Network netip.Prefix
	Gateway netip.Addr
	// ProxyPorts are the node ports of the egress DNS and SNI proxies: a
	// guest may reach them, and only when an egress rule redirected its
	// traffic there.
	ProxyPorts []uint16
	// Node names the agent: its sets of namespace addresses are named
	// after it, so agents sharing the namespace never write each other's.
	Node string
	// AllowMetadata lets this agent's guests reach MetadataAddresses
	// (through the node; the node's own services stay closed). Off, they
	// are dropped at the guest's tap, before any policy.
	AllowMetadata bool
	// Nameserver is the resolver guests are told to use: when it is one of
	// MetadataAddresses (Google Cloud's resolver is its metadata server),
	// DNS to it, and nothing else, still passes.
	Nameserver netip.Addr

	mu sync.Mutex
	// applied is what this process last wrote per tap; a zero Guest means
	// the tap's chains were found in the kernel and their content is not
	// known, so the next Ensure writes them again.
	applied map[string]Guest
	// peers are the addresses of every guest of each namespace in the
	// cluster, on any node (SetNamespaceAddresses); written holds what this
	// agent's set of a namespace's addresses was last given.
	peers   map[string][]netip.Addr
	written map[string]string
}

// MetadataAddresses are where clouds serve a VM its instance metadata,
// credentials among them; a guest reaching one through its node would be
// answered as the node: link-local (AWS, Google Cloud, Azure, OpenStack,
// Oracle, DigitalOcean, Tencent's 169.254.0.23, Scaleway's 169.254.42.42,
// AWS's ECS credentials at 169.254.170.2), Alibaba Cloud's, Azure's
// WireServer (which hands out the VM's extension settings) and Oracle
// Cloud Classic's.
var MetadataAddresses = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("100.100.100.200/32"),
	netip.MustParsePrefix("168.63.129.16/32"),
	netip.MustParsePrefix("192.0.0.192/32"),
}

var (
	ifnamePattern    = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)
	namespacePattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	tapChainPattern  = regexp.MustCompile(`(?m)^\s*chain g_(` + TapPrefix + `[A-Za-z0-9_.-]*) \{`)
)

// validateTap keeps what goes into an nft script to names nft reads as
// names: a tap or namespace is never a piece of syntax.
func validateTap(tap, namespace string) error {
	if !ifnamePattern.MatchString(tap) || !strings.HasPrefix(tap, TapPrefix) {
		return fmt.Errorf("guest baseline: tap name %q: want %s followed by letters or digits, at most 15 characters", tap, TapPrefix)
	}
	if !namespacePattern.MatchString(namespace) {
		return fmt.Errorf("guest baseline: namespace %q of tap %s is not a DNS-1123 label", namespace, tap)
	}
	return nil
}

func (g Guest) validate() error {
	if err := validateTap(g.Tap, g.Namespace); err != nil {
		return err
	}
	if mac, err := net.ParseMAC(g.MAC); err != nil || len(mac) != 6 || mac[0]&1 == 1 {
		return fmt.Errorf("guest baseline: MAC %q of tap %s is not a unicast Ethernet address", g.MAC, g.Tap)
	}
	if !g.IP.Is4() {
		return fmt.Errorf("guest baseline: address %v of tap %s is not IPv4", g.IP, g.Tap)
	}
	return nil
}

func (b *Baseline) validate() error {
	if !ifnamePattern.MatchString(b.Bridge) {
		return fmt.Errorf("guest baseline: bridge name %q is not an interface name", b.Bridge)
	}
	if !b.Network.Addr().Is4() || !b.Network.Contains(b.Gateway) {
		return fmt.Errorf("guest baseline: gateway %v is not in the IPv4 network %v", b.Gateway, b.Network)
	}
	return nil
}

// nsSet is the set of a namespace's taps. Namespaces are DNS-1123 labels,
// which nft accepts in a name as they are: the name is the namespace, so
// two namespaces can never share a set.
func nsSet(namespace string) string { return "ns_" + namespace }

// ipsSet is one agent's set of the addresses of a namespace's guests, on
// its node and on the others as it knows them; tag is the agent's
// (agentTag). The union of the agents' sets (peersChain) is what the host
// may route onto a tap of that namespace from a guest address. A
// namespace has no "_", so no two namespace and tag pairs give one name.
func ipsSet(namespace, tag string) string { return "ips_" + namespace + "_" + tag }

// peersChain accepts what comes from an address in any agent's set of the
// namespace: one rule per agent, each added and deleted only by its agent.
func peersChain(namespace string) string { return "peers_" + namespace }

// agentTag names an agent's own objects: short, stable over restarts, and
// a valid nft name whatever the node's name.
func agentTag(node string) string {
	sum := sha256.Sum256([]byte("baseline/" + node))
	return hex.EncodeToString(sum[:])[:8]
}

func (b *Baseline) tag() string { return agentTag(b.Node) }

// peersRule is this agent's rule in the namespace's peersChain.
func peersRule(namespace, tag string) string {
	return "ip saddr @" + ipsSet(namespace, tag) + " accept"
}

// setupScript creates the shared tables, sets and base chains, and adds
// this agent's bridge, network and gateway. Running it again, from this
// agent or another sharing the namespace, gives the same ruleset: the base
// chains are flushed and refilled in the same transaction.
func setupScript(bridge string, network netip.Prefix, gateway netip.Addr, proxyPorts []uint16) string {
	t := "bridge " + BaselineTable
	i := "inet " + BaselineTable
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format+"\n", args...) }
	w("add table %s", t)
	w("add set %s guests { type ifname; }", t)
	w("add map %s guest_vmap { type ifname : verdict; }", t)
	w("add map %s forward_vmap { type ifname : verdict; }", t)
	w("add map %s output_vmap { type ifname : verdict; }", t)
	w("add set %s guest_networks { type ipv4_addr; flags interval; auto-merge; }", t)
	w("add set %s gateways { type ipv4_addr; }", t)
	// The same constant for every agent; g_<tap> drops what goes there
	// unless its agent allows it.
	w("add set %s metadata { type ipv4_addr; flags interval; }", t)
	w("add element %s metadata { %s }", t, prefixList(MetadataAddresses))
	// Frames from a guest: its own chain, or dropped if it has none yet.
	// The maps goto (not jump) the guest's chain, so a frame that passes
	// it ends the hook with the policy instead of coming back to the drop.
	w("add chain %s prerouting { type filter hook prerouting priority -200; policy accept; }", t)
	w("flush chain %s prerouting", t)
	w("add rule %s prerouting iifname vmap @guest_vmap", t)
	w("add rule %s prerouting iifname %q drop", t, TapPrefix+"*")
	w("add chain %s forward { type filter hook forward priority 0; policy accept; }", t)
	w("flush chain %s forward", t)
	w("add rule %s forward iifname vmap @forward_vmap", t)
	w("add rule %s forward iifname %q drop", t, TapPrefix+"*")
	// The host routing a guest's packet to another (the guest sent it to
	// the gateway's MAC, or it came from a guest on another node) bypasses
	// the forward hook: what the host sends to a guest from a guest
	// address must come from a guest of the tap's namespace (o_<tap>), and
	// from none for a tap without a chain.
	w("add chain %s output { type filter hook output priority 0; policy accept; }", t)
	w("flush chain %s output", t)
	// Guests speak IPv4 and ARP only: the host's IPv6 (router
	// solicitations, DAD, MLD from the bridge), STP and the rest would
	// tell a guest about the host and have no use there.
	w("add rule %s output oifname %q ether type != { ip, arp } drop", t, TapPrefix+"*")
	w("add rule %s output oifname vmap @output_vmap", t)
	w("add rule %s output oifname @guests ip saddr @guest_networks ip saddr != @gateways drop", t)
	w("add element %s guest_networks { %s }", t, network.Masked())
	w("add element %s gateways { %s }", t, gateway)

	w("add table %s", i)
	w("add set %s bridges { type ifname; }", i)
	w("add set %s gateways { type ipv4_addr; }", i)
	// The node's ports that guests' traffic may reach only because an egress
	// rule redirected it there (the DNS proxy). Matching the port after the
	// redirect, not any redirected traffic, keeps out what other NAT rules on
	// the node (a kube-proxy Service whose endpoint is the node) would send.
	w("add set %s proxy_ports { type inet_service; }", i)
	w("add chain %s input { type filter hook input priority -10; policy accept; }", i)
	w("flush chain %s input", i)
	w("add rule %s input iifname @bridges ct state established,related accept", i)
	w("add rule %s input iifname @bridges meta l4proto { tcp, udp } th dport @proxy_ports ct status dnat accept", i)
	// A guest may ping its gateway (a liveness check); the node's other
	// addresses would tell it about the host, and are refused like any
	// other connection to the node.
	w("add rule %s input iifname @bridges icmp type echo-request ip daddr @gateways accept", i)
	w("add rule %s input iifname @bridges reject with icmpx admin-prohibited", i)
	// IPv6 the node's own stack would send out of a tap itself (the tap's
	// link-local address: router solicitations, DAD, MLD) passes no bridge
	// hook: it is dropped here, should the tap's disable_ipv6 (Links) be
	// reset.
	w("add chain %s output { type filter hook output priority -10; policy accept; }", i)
	w("flush chain %s output", i)
	w("add rule %s output oifname %q meta nfproto ipv6 drop", i, TapPrefix+"*")
	w("add element %s bridges { %q }", i, bridge)
	w("add element %s gateways { %s }", i, gateway)
	for _, port := range proxyPorts {
		if port == 0 {
			continue
		}
		w("add element %s proxy_ports { %d }", i, port)
	}
	return s.String()
}

// guestScript pins g's tap to its MAC and address and puts it in its
// namespace; b gives the agent (its set of the namespace's addresses) and
// what its guests may reach. Running it again rewrites the tap's baseline
// chains; the policy chain p_<tap> is left as it is.
func (b *Baseline) guestScript(g Guest) string {
	t := "bridge " + BaselineTable
	tap := g.Tap
	ips := ipsSet(g.Namespace, b.tag())
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format+"\n", args...) }
	w("add set %s %s { type ifname; }", t, nsSet(g.Namespace))
	w("add set %s %s { type ipv4_addr; }", t, ips)
	w("add element %s %s { %s }", t, ips, g.IP)
	w("add chain %s %s", t, peersChain(g.Namespace))
	w("add chain %s p_%s", t, tap)
	w("add chain %s g_%s", t, tap)
	w("flush chain %s g_%s", t, tap)
	w("add rule %s g_%s ether saddr != %s drop", t, tap, g.MAC)
	// Only IPv4 and ARP: IPv6, VLAN tags and the rest would carry traffic
	// past the checks below.
	w("add rule %s g_%s ether type != { ip, arp } drop", t, tap)
	w("add rule %s g_%s arp htype != 1 drop", t, tap)
	w("add rule %s g_%s arp ptype != ip drop", t, tap)
	w("add rule %s g_%s arp hlen != 6 drop", t, tap)
	w("add rule %s g_%s arp plen != 4 drop", t, tap)
	w("add rule %s g_%s arp saddr ether != %s drop", t, tap, g.MAC)
	w("add rule %s g_%s arp saddr ip != %s drop", t, tap, g.IP)
	w("add rule %s g_%s ip version != 4 drop", t, tap)
	w("add rule %s g_%s ip saddr != %s drop", t, tap, g.IP)
	// Before the policy hook, so that no verdict there opens it.
	for _, rule := range b.metadataRules() {
		w("add rule %s g_%s %s", t, tap, rule)
	}
	// The hook for the Machine's own policy, after the checks above: a
	// verdict there cannot let a spoofed frame through, and isolation and
	// host protection are in other hooks.
	w("add rule %s g_%s jump p_%s", t, tap, tap)
	w("add chain %s f_%s", t, tap)
	w("flush chain %s f_%s", t, tap)
	w("add rule %s f_%s oifname @guests oifname != @%s drop", t, tap, nsSet(g.Namespace))
	// From a guest address, only a guest of the namespace: one this agent
	// knows (its own set, which no other agent writes), or one another
	// agent sharing the bridge knows (the union in peers_<namespace>).
	w("add chain %s o_%s", t, tap)
	w("flush chain %s o_%s", t, tap)
	w("add rule %s o_%s ip saddr @%s accept", t, tap, ips)
	w("add rule %s o_%s ip saddr @guest_networks ip saddr != @gateways jump %s", t, tap, peersChain(g.Namespace))
	w("add rule %s o_%s ip saddr @guest_networks ip saddr != @gateways drop", t, tap)
	w("add element %s guests { %q }", t, tap)
	w("add element %s %s { %q }", t, nsSet(g.Namespace), tap)
	w("add element %s guest_vmap { %q : goto g_%s }", t, tap, tap)
	w("add element %s forward_vmap { %q : goto f_%s }", t, tap, tap)
	w("add element %s output_vmap { %q : goto o_%s }", t, tap, tap)
	return s.String()
}

// metadataRules keep the agent's guests from MetadataAddresses, unless it
// allows them; DNS to a nameserver among them still passes.
func (b *Baseline) metadataRules() []string {
	if b.AllowMetadata {
		return nil
	}
	ns := b.Nameserver
	if !ns.Is4() || !slices.ContainsFunc(MetadataAddresses, func(p netip.Prefix) bool { return p.Contains(ns) }) {
		return []string{"ip daddr @metadata drop"}
	}
	return []string{
		fmt.Sprintf("ip daddr %s meta l4proto != { tcp, udp } drop", ns),
		fmt.Sprintf("ip daddr %s th dport != 53 drop", ns),
		fmt.Sprintf("ip daddr != %s ip daddr @metadata drop", ns),
	}
}

// prefixList writes prefixes as nft set elements: a lone address without
// its /32.
func prefixList(prefixes []netip.Prefix) string {
	list := make([]string, len(prefixes))
	for i, p := range prefixes {
		if p.IsSingleIP() {
			list[i] = p.Addr().String()
		} else {
			list[i] = p.Masked().String()
		}
	}
	return strings.Join(list, ", ")
}

// addressesScript gives set (this agent's, of one namespace) exactly
// addrs, in one transaction (no moment with the set empty).
func addressesScript(set string, addrs []netip.Addr) string {
	t := "bridge " + BaselineTable
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format+"\n", args...) }
	w("add set %s %s { type ipv4_addr; }", t, set)
	w("flush set %s %s", t, set)
	if len(addrs) > 0 {
		list := make([]string, len(addrs))
		for i, a := range addrs {
			list[i] = a.String()
		}
		w("add element %s %s { %s }", t, set, strings.Join(list, ", "))
	}
	return s.String()
}

// removeScript takes tap's elements and chains out. nft 1.0.6 (Debian 12)
// has no "destroy": each object is added, then deleted, in one
// transaction, so the script succeeds whatever is left of the tap.
func removeScript(tap, namespace string) string {
	t := "bridge " + BaselineTable
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format+"\n", args...) }
	for _, c := range []string{"g", "f", "o", "p"} {
		w("add chain %s %s_%s", t, c, tap)
	}
	w("add element %s guest_vmap { %q : goto g_%s }", t, tap, tap)
	w("delete element %s guest_vmap { %q }", t, tap)
	w("add element %s forward_vmap { %q : goto f_%s }", t, tap, tap)
	w("delete element %s forward_vmap { %q }", t, tap)
	w("add element %s output_vmap { %q : goto o_%s }", t, tap, tap)
	w("delete element %s output_vmap { %q }", t, tap)
	w("add element %s guests { %q }", t, tap)
	w("delete element %s guests { %q }", t, tap)
	w("add set %s %s { type ifname; }", t, nsSet(namespace))
	w("add element %s %s { %q }", t, nsSet(namespace), tap)
	w("delete element %s %s { %q }", t, nsSet(namespace), tap)
	for _, c := range []string{"g", "f", "o", "p"} {
		w("flush chain %s %s_%s", t, c, tap)
		w("delete chain %s %s_%s", t, c, tap)
	}
	return s.String()
}

// Setup creates the baseline tables (or joins those another agent made)
// and learns which taps already have a baseline, so that a restarted agent
// can remove them.
func (b *Baseline) Setup() error {
	if err := b.validate(); err != nil {
		return err
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return errors.New("guest baseline: the nft command is missing: install the Debian package nftables (hack/install-deps.sh)")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.nft(setupScript(b.Bridge, b.Network, b.Gateway, b.ProxyPorts)); err != nil {
		return err
	}
	out, err := b.output("list", "table", "bridge", BaselineTable)
	if err != nil {
		return err
	}
	b.applied = map[string]Guest{}
	for _, m := range tapChainPattern.FindAllStringSubmatch(out, -1) {
		b.applied[m[1]] = Guest{}
	}
	return nil
}

// Ensure gives g's tap its baseline; it writes only when g differs from
// what this agent wrote last.
func (b *Baseline) Ensure(g Guest) error {
	if err := g.validate(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.applied == nil {
		return errors.New("guest baseline: Setup was not called")
	}
	if b.applied[g.Tap] == g {
		return nil
	}
	script := b.guestScript(g) + addressesScript(ipsSet(g.Namespace, b.tag()), b.namespaceAddresses(g.Namespace, g))
	if !b.hasGuestIn(g.Namespace, g.Tap) {
		// The agent's first tap of the namespace: its rule in the
		// namespace's chain may be there (a restarted agent) or not, and
		// the kernel, not this process, knows.
		handles, err := b.peersRuleHandles(g.Namespace)
		if err != nil {
			return err
		}
		if len(handles) == 0 {
			script += fmt.Sprintf("add rule bridge %s %s %s\n", BaselineTable, peersChain(g.Namespace), peersRule(g.Namespace, b.tag()))
		}
	}
	if err := b.nft(script); err != nil {
		return err
	}
	b.applied[g.Tap] = g
	delete(b.written, g.Namespace)
	return nil
}

// hasGuestIn tells whether this agent pinned a tap of namespace, other
// than except.
func (b *Baseline) hasGuestIn(namespace, except string) bool {
	for tap, g := range b.applied {
		if tap != except && g != (Guest{}) && g.Namespace == namespace {
			return true
		}
	}
	return false
}

// peersRuleHandles finds this agent's rule(s) in the namespace's chain.
func (b *Baseline) peersRuleHandles(namespace string) ([]string, error) {
	out, err := b.output("-a", "list", "chain", "bridge", BaselineTable, peersChain(namespace))
	if err != nil {
		if strings.Contains(err.Error(), "No such file or directory") {
			return nil, nil
		}
		return nil, err
	}
	var handles []string
	rule := peersRule(namespace, b.tag()) + " # handle "
	for _, line := range strings.Split(out, "\n") {
		if h, ok := strings.CutPrefix(strings.TrimSpace(line), rule); ok {
			handles = append(handles, h)
		}
	}
	return handles, nil
}

// SetNamespaceAddresses tells the baseline the addresses of every guest of
// the cluster by namespace, on any node: a tap of a namespace then takes
// what the host routes to it from these guest addresses, those of its
// node's guests of the namespace (which it knows), and those the other
// agents sharing the bridge were told. It writes this agent's sets of the
// namespaces with a tap of its own, each when it changed; the other
// agents' sets are theirs.
func (b *Baseline) SetNamespaceAddresses(byNamespace map[string][]netip.Addr) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.applied == nil {
		return errors.New("guest baseline: Setup was not called")
	}
	b.peers = byNamespace
	if b.written == nil {
		b.written = map[string]string{}
	}
	var script strings.Builder
	wrote := map[string]string{}
	for _, g := range b.applied {
		if g == (Guest{}) || wrote[g.Namespace] != "" {
			continue
		}
		s := addressesScript(ipsSet(g.Namespace, b.tag()), b.namespaceAddresses(g.Namespace, Guest{}))
		wrote[g.Namespace] = s
		if b.written[g.Namespace] != s {
			script.WriteString(s)
		}
	}
	if script.Len() > 0 {
		if err := b.nft(script.String()); err != nil {
			return err
		}
	}
	for ns, s := range wrote {
		b.written[ns] = s
	}
	return nil
}

// namespaceAddresses is what this agent's set of namespace holds: the
// addresses SetNamespaceAddresses gave, and those of the namespace's
// guests pinned here (extra, not yet in applied, included), sorted and
// once each.
func (b *Baseline) namespaceAddresses(namespace string, extra Guest) []netip.Addr {
	seen := map[netip.Addr]bool{}
	var addrs []netip.Addr
	add := func(a netip.Addr) {
		if a.Is4() && !seen[a] {
			seen[a] = true
			addrs = append(addrs, a)
		}
	}
	for _, a := range b.peers[namespace] {
		add(a)
	}
	for _, g := range b.applied {
		if g.Namespace == namespace {
			add(g.IP)
		}
	}
	if extra.Namespace == namespace {
		add(extra.IP)
	}
	sort.Slice(addrs, func(i, j int) bool { return addrs[i].Less(addrs[j]) })
	return addrs
}

// Remove takes tap's baseline out. When this agent has no tap of the
// namespace left, its set of the namespace's addresses and its rule in
// the namespace's chain go too, and the namespace's shared objects once
// no agent has a tap of it on the node network. A tap this agent never
// set up costs nothing.
func (b *Baseline) Remove(tap, namespace string) error {
	if err := validateTap(tap, namespace); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.applied[tap]; !ok {
		return nil
	}
	script := removeScript(tap, namespace)
	removed := b.applied[tap]
	delete(b.applied, tap)
	ips := ipsSet(namespace, b.tag())
	keeps := b.hasGuestIn(namespace, "")
	if keeps {
		// The namespace keeps a tap here: this agent's set loses this
		// guest's address now (unless the cluster still lists it), so
		// that a guest of another namespace given the address later is
		// not taken for one of this namespace.
		script += addressesScript(ips, b.namespaceAddresses(namespace, Guest{}))
	}
	if err := b.nft(script); err != nil {
		b.applied[tap] = removed
		return err
	}
	if !keeps {
		// The rule and the set in one transaction: a tap of this agent's
		// that it found at Setup and has not pinned again still refers to
		// the set, and then the kernel refuses both (EBUSY).
		handles, err := b.peersRuleHandles(namespace)
		if err != nil {
			return err
		}
		var s strings.Builder
		for _, h := range handles {
			fmt.Fprintf(&s, "delete rule bridge %s %s handle %s\n", BaselineTable, peersChain(namespace), h)
		}
		fmt.Fprintf(&s, "add set bridge %s %s { type ipv4_addr; }\ndelete set bridge %s %s\n", BaselineTable, ips, BaselineTable, ips)
		if err := b.nft(s.String()); err != nil && !gone(err) {
			return err
		}
	}
	// The other taps' chains of the namespace, any agent's, refer to these
	// while the namespace has one, so the kernel refuses (EBUSY) until the
	// last is gone; an agent adding a tap re-creates them in the same
	// transaction as the reference. ips_<namespace> is the set all agents
	// shared before each had its own: the last tap rewritten or removed
	// frees it.
	for _, object := range []string{
		"chain bridge " + BaselineTable + " " + peersChain(namespace),
		"set bridge " + BaselineTable + " " + nsSet(namespace),
		"set bridge " + BaselineTable + " ips_" + namespace,
	} {
		if err := b.nft("delete " + object + "\n"); err != nil && !gone(err) {
			return err
		}
	}
	// The set's content is written again with the namespace's next tap.
	delete(b.written, namespace)
	return nil
}

// gone tells whether nft refused to delete an object because it is still
// in use or was not there: both leave the namespace as it should be.
func gone(err error) bool {
	return strings.Contains(err.Error(), "Device or resource busy") || strings.Contains(err.Error(), "No such file or directory")
}

// Repair writes the baseline again if the tables, their base rules, a
// chain or map entry of a tap this agent pinned, this agent's set of a
// namespace's addresses or its rule in the namespace's chain are gone or
// were changed: something flushed the ruleset (nft flush ruleset, a
// firewall service starting) or wrote into what is this agent's. It
// reports whether it had to.
func (b *Baseline) Repair() (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.applied == nil {
		return false, errors.New("guest baseline: Setup was not called")
	}
	bridgeTable, errBridge := b.output("list", "table", "bridge", BaselineTable)
	inetTable, errInet := b.output("list", "table", "inet", BaselineTable)
	bridgeObjects, inetObjects := objects(bridgeTable), objects(inetTable)
	if errBridge == nil && errInet == nil && b.intact(bridgeObjects, inetObjects) {
		return false, nil
	}
	var script strings.Builder
	script.WriteString(setupScript(b.Bridge, b.Network, b.Gateway, b.ProxyPorts))
	for tap, g := range b.applied {
		if g == (Guest{}) {
			// Found in the kernel at Setup, never written by this agent:
			// the next Ensure writes it.
			delete(b.applied, tap)
			continue
		}
		script.WriteString(b.guestScript(g))
	}
	for _, ns := range b.namespaces() {
		script.WriteString(addressesScript(ipsSet(ns, b.tag()), b.namespaceAddresses(ns, Guest{})))
		if !bridgeObjects[peersChain(ns)][peersRule(ns, b.tag())] {
			fmt.Fprintf(&script, "add rule bridge %s %s %s\n", BaselineTable, peersChain(ns), peersRule(ns, b.tag()))
		}
	}
	b.written = nil
	return true, b.nft(script.String())
}

// namespaces are those of the taps this agent pinned, sorted.
func (b *Baseline) namespaces() []string {
	var list []string
	for _, g := range b.applied {
		if g != (Guest{}) && !slices.Contains(list, g.Namespace) {
			list = append(list, g.Namespace)
		}
	}
	sort.Strings(list)
	return list
}

// intact tells whether the indexed tables still hold the base rules, every
// pinned tap's chains and map entries, and this agent's sets and rules of
// its namespaces with exactly their content. The listing is indexed once,
// so a node with many taps does not scan it per tap.
func (b *Baseline) intact(bridgeObjects, inetObjects map[string]map[string]bool) bool {
	has := func(in map[string]map[string]bool, object string, lines ...string) bool {
		for _, line := range lines {
			if !in[object][line] {
				return false
			}
		}
		return true
	}
	kt := fmt.Sprintf("iifname %q drop", TapPrefix+"*")
	if !has(bridgeObjects, "prerouting", "iifname vmap @guest_vmap", kt) ||
		!has(bridgeObjects, "forward", "iifname vmap @forward_vmap", kt) ||
		!has(bridgeObjects, "output",
			fmt.Sprintf("oifname %q ether type != { ip, arp } drop", TapPrefix+"*"),
			"oifname vmap @output_vmap",
			"oifname @guests ip saddr @guest_networks ip saddr != @gateways drop") ||
		!has(bridgeObjects, "metadata", strings.Split(prefixList(MetadataAddresses), ", ")...) ||
		!has(inetObjects, "input",
			"iifname @bridges meta l4proto { tcp, udp } th dport @proxy_ports ct status dnat accept",
			"iifname @bridges icmp type echo-request ip daddr @gateways accept",
			"iifname @bridges reject with icmpx admin-prohibited") ||
		!has(inetObjects, "output", fmt.Sprintf("oifname %q meta nfproto ipv6 drop", TapPrefix+"*")) ||
		!has(inetObjects, "bridges", fmt.Sprintf("%q", b.Bridge)) ||
		!has(inetObjects, "gateways", b.Gateway.String()) {
		return false
	}
	for tap, g := range b.applied {
		if g == (Guest{}) {
			continue
		}
		if !has(bridgeObjects, "g_"+tap, append([]string{
			"ether saddr != " + g.MAC + " drop",
			"arp saddr ether != " + g.MAC + " drop",
			"arp saddr ip != " + g.IP.String() + " drop",
			"ip saddr != " + g.IP.String() + " drop",
			"jump p_" + tap}, b.metadataRules()...)...) ||
			!has(bridgeObjects, "f_"+tap, "oifname @guests oifname != @"+nsSet(g.Namespace)+" drop") ||
			!has(bridgeObjects, "guest_vmap", fmt.Sprintf("%q : goto g_%s", tap, tap)) ||
			!has(bridgeObjects, "forward_vmap", fmt.Sprintf("%q : goto f_%s", tap, tap)) ||
			!has(bridgeObjects, "o_"+tap,
				"ip saddr @"+ipsSet(g.Namespace, b.tag())+" accept",
				"ip saddr @guest_networks ip saddr != @gateways jump "+peersChain(g.Namespace),
				"ip saddr @guest_networks ip saddr != @gateways drop") ||
			!has(bridgeObjects, "output_vmap", fmt.Sprintf("%q : goto o_%s", tap, tap)) ||
			!has(bridgeObjects, "guests", fmt.Sprintf("%q", tap)) ||
			!has(bridgeObjects, nsSet(g.Namespace), fmt.Sprintf("%q", tap)) {
			return false
		}
	}
	for _, ns := range b.namespaces() {
		if !has(bridgeObjects, peersChain(ns), peersRule(ns, b.tag())) {
			return false
		}
		// Exactly what this agent would write: an address another writer
		// added would let a guest of another namespace in.
		set, ok := bridgeObjects[ipsSet(ns, b.tag())]
		if !ok {
			return false
		}
		var got []netip.Addr
		for entry := range set {
			if a, err := netip.ParseAddr(entry); err == nil {
				got = append(got, a)
			}
		}
		sort.Slice(got, func(i, j int) bool { return got[i].Less(got[j]) })
		if !slices.Equal(got, b.namespaceAddresses(ns, Guest{})) {
			return false
		}
	}
	return true
}

// objects indexes an `nft list table` listing: each chain, set or map by
// name, with its rules, or its elements, one per entry (nft prints several
// elements to a line).
func objects(listing string) map[string]map[string]bool {
	index := map[string]map[string]bool{}
	var current map[string]bool
	inElements := false
	for _, line := range strings.Split(listing, "\n") {
		line = strings.TrimSpace(line)
		if f := strings.Fields(line); len(f) == 3 && f[2] == "{" && (f[0] == "chain" || f[0] == "set" || f[0] == "map") {
			current = map[string]bool{}
			index[f[1]] = current
			inElements = false
			continue
		}
		if current == nil {
			continue
		}
		if rest, ok := strings.CutPrefix(line, "elements = { "); ok {
			inElements = true
			line = rest
		}
		if !inElements {
			current[line] = true
			continue
		}
		if rest, ok := strings.CutSuffix(line, " }"); ok {
			inElements = false
			line = rest
		}
		for _, element := range strings.Split(strings.TrimSuffix(line, ","), ",") {
			if element = strings.TrimSpace(element); element != "" {
				current[element] = true
			}
		}
	}
	return index
}

// Keep calls Repair every interval until ctx ends: between a flush and the
// next look, guests are unfiltered.
func (b *Baseline) Keep(ctx context.Context, interval time.Duration, logger func(error, string)) error {
	return KeepRepaired(ctx, interval, "the guest baseline", b.Repair, logger)
}

// KeepRepaired calls repair every interval until ctx ends, and tells logger
// when it failed or had to write what (rules of the node's nftables) again.
func KeepRepaired(ctx context.Context, interval time.Duration, what string, repair func() (bool, error), logger func(error, string)) error {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		repaired, err := repair()
		if err != nil {
			logger(err, "could not repair "+what)
		} else if repaired {
			logger(nil, what+" had been removed from nftables; written again")
		}
	}
}

// Taps lists the taps with a baseline in the namespace, any agent's, sorted.
func (b *Baseline) Taps() ([]string, error) {
	out, err := b.output("list", "table", "bridge", BaselineTable)
	if err != nil {
		return nil, err
	}
	var taps []string
	for _, m := range tapChainPattern.FindAllStringSubmatch(out, -1) {
		taps = append(taps, m[1])
	}
	sort.Strings(taps)
	return taps, nil
}

// RemoveBaseline deletes both baseline tables of netns (empty: the
// caller's), for when the node network is torn down. Every guest on a
// bridge there loses its baseline; taps left behind can send nothing until
// an agent sets it up again. Missing tables are not an error.
func RemoveBaseline(netns string) error {
	b := &Baseline{NetNS: netns}
	var script strings.Builder
	for _, family := range []string{"bridge", "inet"} {
		fmt.Fprintf(&script, "add table %s %s\ndelete table %s %s\n", family, BaselineTable, family, BaselineTable)
	}
	return b.nft(script.String())
}

func (b *Baseline) command(args ...string) *exec.Cmd {
	if b.NetNS != "" {
		return exec.Command("ip", append([]string{"netns", "exec", b.NetNS, "nft"}, args...)...)
	}
	return exec.Command("nft", args...)
}

// nft runs script as one transaction: all of it or nothing.
func (b *Baseline) nft(script string) error {
	cmd := b.command("-f", "-")
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("guest baseline: nft -f (netns %q): %v: %s", b.NetNS, err, strings.TrimSpace(out.String()))
	}
	return nil
}

func (b *Baseline) output(args ...string) (string, error) {
	out, err := b.command(args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("guest baseline: nft %s (netns %q): %v: %s", strings.Join(args, " "), b.NetNS, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
