package egress

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os/exec"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

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
//     confined guest's packets to the Machine's chain, which accepts
//     replies, what the policy allows and nothing else; its nat
//     prerouting chain sends the confined guests' DNS, to whatever
//     resolver, to the DNS proxy.
//
// Machine objects are named after the tap, unique per node, so agents
// sharing a namespace (kairon-local) never touch each other's. What the
// inet table chooses per guest (egress4, dns_<port>, sni_<port>) is keyed
// by the Machine: its source address and source MAC together ("ip saddr
// . ether saddr"), which the baseline pins to the tap. Never by address
// alone: two agents sharing the table may confine two guests that a
// fault gave the same address, and each must keep its own entry, with
// its own policy, instead of the last writer's.
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
	// MAC is the guest's Ethernet address (network.MAC), which the bridge
	// baseline pins to Tap: with IP, the Machine's key in the inet table.
	MAC string
	IP  netip.Addr
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
	// byIP lists the taps of the Machines this agent applied, by address:
	// more than one only through a fault elsewhere, and then the proxies,
	// which know a guest by its address alone, answer none of them.
	byIP map[netip.Addr][]string

	// nlMu serializes the use of nl, the netlink session (see open). It
	// is taken after mu, never before.
	nlMu sync.Mutex
	nl   *session
}

type applied struct {
	m      Machine
	policy *Policy
	// sets are the Machine's learned-address sets this agent wrote.
	sets []string
}

var (
	ifnamePattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)
	learnedSet    = regexp.MustCompile(`^l4_([A-Za-z0-9_.-]+)_[0-9a-f]{10}$`)
)

func (m Machine) validate() error {
	if !ifnamePattern.MatchString(m.Tap) {
		return fmt.Errorf("egress: tap name %q of Machine %s/%s is not an interface name", m.Tap, m.Namespace, m.Name)
	}
	if !m.IP.Is4() {
		return fmt.Errorf("egress: address %v of Machine %s/%s is not IPv4", m.IP, m.Namespace, m.Name)
	}
	if hw, err := net.ParseMAC(m.MAC); err != nil || len(hw) != 6 {
		return fmt.Errorf("egress: MAC %q of Machine %s/%s is not an Ethernet address", m.MAC, m.Namespace, m.Name)
	}
	return nil
}

// mac is the Machine's MAC, which validate checked.
func (m Machine) mac() net.HardwareAddr {
	hw, _ := net.ParseMAC(m.MAC)
	return hw
}

// key is the Machine's key in egress4, dns_<port> and sni_<port>: "IP .
// MAC".
func (m Machine) key() []byte { return machineKey(m.IP, m.mac()) }

// DefaultMinTTL and DefaultMaxTTL bound a learned address's life, and
// DefaultGrace is added to it, when the Enforcer sets none of its own.
const (
	DefaultMinTTL = 30 * time.Second
	DefaultMaxTTL = time.Hour
	DefaultGrace  = 5 * time.Second
)

func (e *Enforcer) defaults() {
	if e.MinTTL == 0 {
		e.MinTTL = DefaultMinTTL
	}
	if e.MaxTTL == 0 {
		e.MaxTTL = DefaultMaxTTL
	}
	if e.Grace == 0 {
		e.Grace = DefaultGrace
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
	e.mu.Lock()
	defer e.mu.Unlock()
	s, err := e.open()
	if err != nil {
		return err
	}
	defer s.close()
	old, err := s.addressKeyed(e)
	if err != nil {
		return err
	}
	b := s.batch()
	b.dropAddressKeyed(old)
	b.setup(e)
	if err := b.commit(e.NetNS); err != nil {
		return err
	}
	if e.machines == nil {
		e.machines = map[string]*applied{}
		e.byIP = map[netip.Addr][]string{}
	}
	// Taps confined by an earlier agent stay confined as they are until
	// Apply or Remove: their entry has no policy, so the first Apply
	// rewrites them and Remove knows to look.
	taps, err := s.confined()
	if err != nil {
		return err
	}
	for _, tap := range taps {
		if e.machines[tap] == nil {
			e.machines[tap] = &applied{}
		}
	}
	return nil
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
		if len(g.SNI) == 0 || !g.AllowsPort(dst.Port()) {
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
	s, err := e.open()
	if err != nil {
		return false
	}
	defer s.close()
	elems, err := s.elements(nftables.TableFamilyINet, learnedSetName(tap, grantID))
	if err != nil {
		return false
	}
	key := ip4Key(ip)
	return slices.ContainsFunc(elems, func(el element) bool { return bytes.Equal(el.key, key) })
}

// dnsSet holds the confined guests whose DNS goes to this agent's proxy;
// the chain redirecting it has the same name.
func (e *Enforcer) dnsSet() string { return fmt.Sprintf("dns_%d", e.DNSPort) }

// setsOf lists tap's learned sets in the kernel.
func (s *session) setsOf(tap string) ([]string, error) {
	names, err := s.setNames()
	if err != nil {
		return nil, fmt.Errorf("egress: listing the sets of table inet %s: %w", Table, err)
	}
	var sets []string
	for _, n := range names {
		if m := learnedSet.FindStringSubmatch(n); m != nil && m[1] == tap {
			sets = append(sets, n)
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
	if old := e.machines[m.Tap]; old != nil && old.policy != nil && old.m == m && reflect.DeepEqual(old.policy, p) {
		return nil
	}
	s, err := e.open()
	if err != nil {
		return err
	}
	defer func() {
		if s != nil {
			s.close()
		}
	}()
	keep := learnedSets(m.Tap, p)
	if old := e.machines[m.Tap]; old == nil || (old.policy != nil && bytes.Equal(old.m.key(), m.key())) {
		// The common case, a new Machine or a new policy for the same
		// key: the kernel holds what this agent wrote, so one transaction
		// without reading it first. If another tap holds the key (the
		// other end of the Machine's migration in a shared namespace),
		// the kernel refuses the map entry and the careful path below
		// looks.
		var stale []string
		if old != nil {
			stale = slices.DeleteFunc(slices.Clone(old.sets), func(set string) bool { return slices.Contains(keep, set) })
		}
		b := s.batch()
		b.machine(e, m, p, stale, old == nil || !hasSNI(old.policy), false)
		if err := b.commit(e.NetNS); err == nil {
			e.record(m, p, keep)
			return nil
		}
		// New sockets for the careful path: the failed batch may have
		// left answers unread.
		s.close()
		if s, err = e.open(); err != nil {
			return err
		}
	}
	owners, err := s.owners()
	if err != nil {
		return err
	}
	existing, err := s.setsOf(m.Tap)
	if err != nil {
		return err
	}
	stale := slices.DeleteFunc(existing, func(set string) bool { return slices.Contains(keep, set) })
	b := s.batch()
	key := string(m.key())
	if o, ok := owners[key]; ok && o != m.Tap {
		// Another tap's entry for this Machine's key: the other end of its
		// migration in a shared namespace (another Machine has another
		// MAC, so another key). Ours replaces it.
		b.deleteElements(b.egress4(), keysOf(m.key()))
	}
	b.machine(e, m, p, stale, false, false)
	// The tap's entries under another key (its address changed, here or
	// before a restart) go in the same transaction as the new ones come,
	// so the tap is never open.
	gone := map[string]string{}
	for k, tap := range owners {
		if tap == m.Tap && k != key {
			gone[k] = tap
		}
	}
	if old := e.machines[m.Tap]; old != nil && old.m.IP.IsValid() && string(old.m.key()) != key {
		gone[string(old.m.key())] = owners[string(old.m.key())]
	}
	for _, k := range slices.Sorted(maps.Keys(gone)) {
		b.forget(e, m.Tap, []byte(k), gone[k])
	}
	if err := b.commit(e.NetNS); err != nil {
		return err
	}
	e.record(m, p, keep)
	return nil
}

func hasSNI(p *Policy) bool {
	return p != nil && slices.ContainsFunc(p.Grants, func(g Grant) bool { return len(g.SNI) > 0 })
}

// record notes what Apply wrote for m.
func (e *Enforcer) record(m Machine, p *Policy, sets []string) {
	if old := e.machines[m.Tap]; old != nil {
		e.unindex(m.Tap, old.m.IP)
	}
	e.machines[m.Tap] = &applied{m: m, policy: p, sets: sets}
	e.byIP[m.IP] = append(e.byIP[m.IP], m.Tap)
}

// unindex takes tap out of byIP's list for ip.
func (e *Enforcer) unindex(tap string, ip netip.Addr) {
	taps := slices.DeleteFunc(slices.Clone(e.byIP[ip]), func(t string) bool { return t == tap })
	if len(taps) == 0 {
		delete(e.byIP, ip)
		return
	}
	e.byIP[ip] = taps
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
	s, err := e.open()
	if err != nil {
		return err
	}
	defer s.close()
	owners, err := s.owners()
	if err != nil {
		return err
	}
	// The keys to forget: the Machine's, whoever holds its entry now, and
	// any whose entry points at tap's chain (all of them, for a tap found
	// at Setup). Never another tap's entry under another key.
	forget := map[string]string{}
	if a.m.IP.IsValid() {
		forget[string(a.m.key())] = owners[string(a.m.key())]
	}
	for key, owner := range owners {
		if owner == tap {
			forget[key] = owner
		}
	}
	sets, err := s.setsOf(tap)
	if err != nil {
		return err
	}
	b := s.batch()
	b.remove(e, tap, forget, sets)
	if err := b.commit(e.NetNS); err != nil {
		return err
	}
	delete(e.machines, tap)
	e.unindex(tap, a.m.IP)
	return nil
}

// owners maps each Machine key in egress4 (as a string of its bytes) to
// the tap whose chain its entry points at.
func (s *session) owners() (map[string]string, error) {
	elems, err := s.elements(nftables.TableFamilyINet, "egress4")
	if err != nil {
		return nil, fmt.Errorf("egress: listing map inet %s egress4: %w", Table, err)
	}
	owners := map[string]string{}
	for _, el := range elems {
		if tap, isMachine := strings.CutPrefix(el.chain, "e_"); isMachine {
			owners[string(el.key)] = tap
		}
	}
	return owners, nil
}

// confined lists the taps with an egress chain in the inet table.
func (s *session) confined() ([]string, error) {
	chains, err := s.chainNames(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("egress: listing the chains of table inet %s: %w", Table, err)
	}
	var taps []string
	for _, c := range chains {
		if tap, ok := strings.CutPrefix(c, "e_"); ok {
			taps = append(taps, tap)
		}
	}
	sort.Strings(taps)
	return taps, nil
}

// Confined lists the taps with an egress chain in the namespace, any
// agent's, sorted.
func (e *Enforcer) Confined() ([]string, error) {
	s, err := e.open()
	if err != nil {
		return nil, err
	}
	defer s.close()
	return s.confined()
}

// Lookup finds the confined Machine that has address ip, and its policy.
// It finds none if several of this agent's Machines have ip (a fault
// elsewhere): the proxies know a guest by its address alone, and
// answering with one Machine's policy would lend its grants to another.
func (e *Enforcer) Lookup(ip netip.Addr) (Machine, *Policy, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	a := e.byAddress(ip)
	if a == nil {
		return Machine{}, nil, false
	}
	return a.m, a.policy, a.policy != nil
}

// byAddress is the one Machine this agent applied at ip, or nil: none,
// or more than one.
func (e *Enforcer) byAddress(ip netip.Addr) *applied {
	taps := e.byIP[ip.Unmap()]
	if len(taps) != 1 {
		return nil
	}
	return e.machines[taps[0]]
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
	var tap string
	var p *Policy
	if a := e.byAddress(ip); a != nil {
		tap, p = a.m.Tap, a.policy
	}
	e.mu.Unlock()
	if p == nil {
		return fmt.Errorf("egress: no confined Machine, or more than one, has address %v", ip)
	}
	var v4 []netip.Addr
	for _, a := range addrs {
		if a = a.Unmap(); a.Is4() {
			v4 = append(v4, a)
		}
	}
	ids := p.LearnFor(name)
	if len(ids) == 0 || len(v4) == 0 {
		return nil
	}
	sets := make([]string, len(ids))
	for i, id := range ids {
		sets[i] = learnedSetName(tap, id)
	}
	s, err := e.open()
	if err != nil {
		return err
	}
	defer s.close()
	b := s.batch()
	b.learn(sets, v4, e.TTL(ttl).Round(time.Second))
	return b.commit(e.NetNS)
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
	defer e.Close()
	s, err := e.open()
	if err != nil {
		return err
	}
	defer s.close()
	b := s.batch()
	b.removeTables()
	return b.commit(netns)
}

// exec runs cmd in the enforcer's namespace. A child starts in the
// network namespace of the thread that forks it, so cmd is started from a
// thread moved into NetNS (see inNetNS).
func (e *Enforcer) exec(cmd *exec.Cmd) error {
	if e.NetNS == "" {
		return cmd.Run()
	}
	return inNetNS(e.NetNS, cmd.Run)
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
// chain or map entry of a Machine this agent confined are gone or not
// its own: something flushed the ruleset, or deleted or overwrote an
// entry. Learned addresses are lost with a flush; the guest resolves
// again. It reports whether it had to.
func (e *Enforcer) Repair() (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.machines == nil {
		return false, errors.New("egress: Setup was not called")
	}
	s, err := e.open()
	if err != nil {
		return false, err
	}
	if e.intact(s) {
		s.close()
		return false, nil
	}
	// renew gives a session whose read failed midway (its replies may be
	// left unread) new sockets.
	renew := func() error {
		if !s.broken {
			return nil
		}
		s.close()
		s, err = e.open()
		return err
	}
	if err := renew(); err != nil {
		return true, err
	}
	// What holds this agent's keys now, read before the batch: an entry
	// that points elsewhere is taken out in the batch that writes ours,
	// as the kernel refuses to overwrite it. If the read fails, the batch
	// goes all the same: what is missing it writes.
	held, _ := s.entries(e)
	type fix struct {
		egress4, sni, yielded bool
	}
	fixes := map[string]fix{}
	for tap, a := range e.machines {
		if a.policy == nil {
			continue
		}
		var f fix
		key := a.m.key()
		if chain, ok := held.egress4[string(key)]; ok && chain != "e_"+tap {
			f.yielded = e.peerHolds(s, a.m, chain)
			f.egress4 = !f.yielded
		}
		if chain, ok := held.sni[string(key)]; ok && chain != "s_"+tap {
			f.sni = true
		}
		fixes[tap] = f
	}
	if err := renew(); err != nil {
		return true, err
	}
	defer s.close()
	b := s.batch()
	b.setup(e)
	n := 0
	for tap, a := range e.machines {
		if a.policy == nil {
			// Found at Setup, never written by this agent: the next Apply
			// writes it.
			delete(e.machines, tap)
			continue
		}
		f := fixes[tap]
		if f.egress4 {
			// delete element inet T egress4 { IP . MAC }: another chain's.
			b.deleteElements(b.egress4(), keysOf(a.m.key()))
		}
		if f.sni {
			// delete element inet T sni_P { IP . MAC }: another chain's.
			b.deleteElements(b.sniMap(e), keysOf(a.m.key()))
		}
		// The learned sets are gone or not; adding them is idempotent.
		b.machine(e, a.m, a.policy, nil, f.sni, f.yielded)
		if n++; n%repairBatch == 0 {
			if err := b.commit(e.NetNS); err != nil {
				return true, err
			}
			b = s.batch()
		}
	}
	return true, b.commit(e.NetNS)
}

// repairBatch is how many Machines a batch of Repair rewrites: each
// Machine is whole in one batch, and a batch's answers stay well within
// the session's socket buffers however many Machines the node confines.
const repairBatch = 50

// held is what the maps keyed by Machine hold: each key (as a string of
// its bytes) to the chain its entry goes to, and the keys in the DNS set.
type held struct {
	egress4, sni map[string]string
	dns          map[string]bool
}

// entries reads egress4, and the agent's DNS set and SNI map if it has
// them.
func (s *session) entries(e *Enforcer) (held, error) {
	h := held{egress4: map[string]string{}, sni: map[string]string{}, dns: map[string]bool{}}
	read := func(set string, each func(element)) error {
		elems, err := s.elements(nftables.TableFamilyINet, set)
		if err != nil {
			return fmt.Errorf("egress: listing inet %s %s: %w", Table, set, err)
		}
		for _, el := range elems {
			each(el)
		}
		return nil
	}
	errs := []error{read("egress4", func(el element) { h.egress4[string(el.key)] = el.chain })}
	if e.DNSPort != 0 {
		errs = append(errs, read(e.dnsSet(), func(el element) { h.dns[string(el.key)] = true }))
	}
	if e.SNIPort != 0 {
		errs = append(errs, read(e.sniMap(), func(el element) { h.sni[string(el.key)] = el.chain }))
	}
	return h, errors.Join(errs...)
}

// peerHolds tells whether chain, where m's egress4 entry goes instead of
// m's own chain, is that of the other end of m's migration in a shared
// namespace: another tap's chain, the tap pinned to m's MAC by the
// baseline. It confines m by m's policies, so it is left to it (taking it
// back would have the two agents take turns at every tick); anything
// else holding m's key is written over.
func (e *Enforcer) peerHolds(s *session, m Machine, chain string) bool {
	tap, ok := strings.CutPrefix(chain, "e_")
	return ok && tap != m.Tap && s.pinnedTo(tap, m.mac())
}

// intact tells whether the base rules and every Machine's chains and map
// entries are in the kernel, the entries pointing at the Machine's own
// chains (or, for egress4, at the other end of its migration: see
// peerHolds). A failed read counts as not intact: Repair then writes
// everything, which is idempotent.
func (e *Enforcer) intact(s *session) bool {
	b := s.batch()
	// hasRule tells whether chain of t has a rule with an expression
	// that want accepts.
	hasRule := func(t *nftables.Table, chain string, want func(expr.Any) bool) bool {
		rules, err := s.conn.GetRules(t, chainOf(t, chain))
		if err != nil {
			if !errors.Is(err, unix.ENOENT) {
				s.broken = true
			}
			return false
		}
		return slices.ContainsFunc(rules, func(r *nftables.Rule) bool { return slices.ContainsFunc(r.Exprs, want) })
	}
	vmapOf := func(set string) func(expr.Any) bool {
		return func(x expr.Any) bool {
			l, ok := x.(*expr.Lookup)
			return ok && l.IsDestRegSet && l.SetName == set
		}
	}
	// bridge: iifname vmap @egress_vmap; inet: ip saddr . ether saddr vmap @egress4.
	if !hasRule(b.bridge, "forward", vmapOf("egress_vmap")) || !hasRule(b.inet, "forward", vmapOf("egress4")) {
		return false
	}
	if e.DNSPort != 0 && !hasRule(b.inet, e.dnsSet(), func(x expr.Any) bool {
		// redirect to :DNSPort
		i, ok := x.(*expr.Immediate)
		return ok && bytes.Equal(i.Data, binaryutil.BigEndian.PutUint16(e.DNSPort))
	}) {
		return false
	}
	if e.SNIPort != 0 && !hasRule(b.inet, e.sniMap(), vmapOf(e.sniMap())) {
		return false
	}
	if e.Masquerade != "" && !hasRule(b.inet, "masq_"+e.Masquerade, func(x expr.Any) bool { _, ok := x.(*expr.Masq); return ok }) {
		return false
	}
	var mine []*applied
	for _, a := range e.machines {
		if a.policy != nil {
			mine = append(mine, a)
		}
	}
	if len(mine) == 0 {
		return true
	}
	bridgeChains, err1 := s.chainNames(nftables.TableFamilyBridge)
	inetChains, err2 := s.chainNames(nftables.TableFamilyINet)
	vmap, err3 := s.elements(nftables.TableFamilyBridge, "egress_vmap")
	h, err4 := s.entries(e)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return false
	}
	for _, a := range mine {
		chain := "e_" + a.m.Tap
		if !slices.Contains(bridgeChains, chain) || !slices.Contains(inetChains, chain) {
			return false
		}
		tapKey := ifnameKey(a.m.Tap)
		if !slices.ContainsFunc(vmap, func(el element) bool { return bytes.Equal(el.key, tapKey) && el.chain == chain }) {
			return false
		}
		key := a.m.key()
		if got := h.egress4[string(key)]; got != chain && !e.peerHolds(s, a.m, got) {
			return false
		}
		if e.DNSPort != 0 && !h.dns[string(key)] {
			return false
		}
		if e.SNIPort != 0 && hasSNI(a.policy) && h.sni[string(key)] != "s_"+a.m.Tap {
			return false
		}
	}
	return !s.broken
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

var counterPattern = regexp.MustCompile(`^d_([A-Za-z0-9_.-]+)_(ip|port|icmp)$`)

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
	s, err := e.open()
	if err != nil {
		return nil, err
	}
	objs, err := s.conn.GetObjects(s.batch().inet)
	if err != nil {
		s.broken = true
	}
	s.close() // before mu: see nlMu
	if err != nil {
		return nil, fmt.Errorf("egress: listing the counters of table inet %s (netns %q): %w", Table, e.NetNS, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var ds []Denied
	for _, o := range objs {
		c, ok := o.(*nftables.CounterObj)
		if !ok {
			continue
		}
		m := counterPattern.FindStringSubmatch(c.Name)
		if m == nil {
			continue
		}
		a := e.machines[m[1]]
		if a == nil || a.policy == nil {
			continue
		}
		ds = append(ds, Denied{Machine: a.m, Reason: m[2], Packets: c.Packets})
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
	e.mu.Lock()
	var mine []Machine
	for _, a := range e.machines {
		if a.policy != nil {
			mine = append(mine, a.m)
		}
	}
	e.mu.Unlock()
	s, err := e.open()
	if err != nil {
		return nil, err
	}
	defer s.close()
	var ds []DeniedDestination
	for _, m := range mine {
		for _, reason := range DenyReasons {
			elems, err := s.elements(nftables.TableFamilyINet, recentName(m.Tap, reason))
			if errors.Is(err, unix.ENOENT) {
				// Removed meanwhile.
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("egress: listing set inet %s %s (netns %q): %w", Table, recentName(m.Tap, reason), e.NetNS, err)
			}
			for _, el := range elems {
				// ip daddr . meta l4proto . th dport, each padded to 32 bits.
				if len(el.key) != 12 {
					continue
				}
				ip, _ := netip.AddrFromSlice(el.key[:4])
				d := DeniedDestination{Machine: m, Reason: reason, Address: ip, Protocol: protocolName(el.key[4]), Age: max(recentWindow-el.expires, 0)}
				if d.Protocol == "tcp" || d.Protocol == "udp" {
					d.Port = binary.BigEndian.Uint16(el.key[8:10])
				}
				ds = append(ds, d)
			}
		}
	}
	sort.SliceStable(ds, func(i, j int) bool { return ds[i].Age > ds[j].Age })
	return ds, nil
}

// protocolName names an IP protocol as nft lists it, or gives its number.
func protocolName(p byte) string {
	switch p {
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_IGMP:
		return "igmp"
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_GRE:
		return "gre"
	case unix.IPPROTO_ESP:
		return "esp"
	case unix.IPPROTO_AH:
		return "ah"
	case unix.IPPROTO_ICMPV6:
		return "ipv6-icmp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}
