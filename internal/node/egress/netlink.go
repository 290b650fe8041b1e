package egress

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/zyvor/kairon/internal/node/network"
)

// The enforcer talks to nf_tables over netlink (github.com/google/nftables):
// each operation is one batch, which the kernel commits whole or not at
// all, as `nft -f` did with a script, without starting a process or
// fetching the ruleset first. The comments show each rule as nft text;
// TestNetlinkMatchesScript lists what the batches build next to what those
// texts build and compares.

// session is the enforcer's conversation with nf_tables in its namespace:
// two netlink sockets, one for batches and one for dumps, kept for the
// enforcer's life. Keeping them matters: closing a socket that committed
// waits for the kernel to finish releasing what the commit replaced (an
// RCU grace period, 10 to 30 ms on a loaded host), which is most of what
// a short-lived `nft` process cost.
type session struct {
	e      *Enforcer
	conn   *nftables.Conn
	dumper *netlink.Conn
	ns     *os.File // nil: the caller's namespace
	// broken: an exchange failed, and its replies may be left unread; the
	// sockets are closed and the next session dials new ones.
	broken bool
}

// open takes the enforcer's session, dialing it the first time, for one
// operation; close gives it back. Operations on the kernel are serialized.
func (e *Enforcer) open() (*session, error) {
	e.nlMu.Lock()
	if e.nl != nil {
		return e.nl, nil
	}
	s := &session{e: e}
	var opts []nftables.ConnOption
	if e.NetNS != "" {
		// Opened once: the sockets stay in the namespace the file names
		// now.
		f, err := os.Open("/run/netns/" + e.NetNS)
		if err != nil {
			e.nlMu.Unlock()
			return nil, fmt.Errorf("egress: netns %q: %w", e.NetNS, err)
		}
		s.ns = f
		opts = append(opts, nftables.WithNetNSFd(int(f.Fd())))
	}
	c, err := nftables.New(append(opts, nftables.AsLasting(), nftables.WithSockOptions(roomyBuffers))...)
	if err != nil {
		s.shutdown()
		e.nlMu.Unlock()
		return nil, fmt.Errorf("egress: netlink (netns %q): %w", e.NetNS, err)
	}
	s.conn = c
	e.nl = s
	return s, nil
}

// socketBuffer bounds what one batch may send and get back at once. The
// kernel answers every message of a batch, and echoes every rule
// (github.com/google/nftables asks it to), before the batch's sender
// reads any of it: a Machine with a large policy overflows the default
// buffer (about 200 KiB), and a repair of many Machines needs tens of
// MiB. As nft does, the socket's buffers are forced up; the memory is
// taken only while a batch's answers wait to be read.
const socketBuffer = 64 << 20

func roomyBuffers(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = errors.Join(
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, socketBuffer),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, socketBuffer))
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("egress: netlink socket buffers: %w", serr)
	}
	return nil
}

func (s *session) close() {
	e := s.e
	if s.broken {
		s.shutdown()
		e.nl = nil
	}
	e.nlMu.Unlock()
}

func (s *session) shutdown() {
	if s.conn != nil {
		_ = s.conn.CloseLasting()
	}
	if s.dumper != nil {
		_ = s.dumper.Close()
	}
	if s.ns != nil {
		_ = s.ns.Close()
	}
}

// Close releases the enforcer's netlink sockets; a later operation dials
// new ones.
func (e *Enforcer) Close() {
	e.nlMu.Lock()
	defer e.nlMu.Unlock()
	if e.nl != nil {
		e.nl.shutdown()
		e.nl = nil
	}
}

// batch collects one transaction.
type batch struct {
	s            *session
	c            *nftables.Conn
	bridge, inet *nftables.Table
	err          error
}

func (s *session) batch() *batch {
	return &batch{
		s:      s,
		c:      s.conn,
		bridge: &nftables.Table{Family: nftables.TableFamilyBridge, Name: Table},
		inet:   &nftables.Table{Family: nftables.TableFamilyINet, Name: Table},
	}
}

// commit sends the batch: all of it or nothing.
func (b *batch) commit(netns string) error {
	if b.err != nil {
		return fmt.Errorf("egress: netns %q: %w", netns, b.err)
	}
	if err := b.c.Flush(); err != nil {
		b.s.broken = true
		return fmt.Errorf("egress: nf_tables transaction (netns %q): %w", netns, err)
	}
	return nil
}

func (b *batch) fail(err error) {
	if err != nil && b.err == nil {
		b.err = err
	}
}

// setIDs numbers the sets the batches create: a rule refers to a set
// added in the same batch by its ID, which need only be unique within the
// batch. Numbered here, process-wide, because the counter of
// github.com/google/nftables is not safe for concurrent batches.
var setIDs atomic.Uint32

func newSetID() uint32 { return setIDs.Add(1) }

// Set types of the tables. A concatenation's key is each component padded
// to 32 bits.
var (
	recentType = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)
	// machineType keys what is chosen per guest: its address and its MAC
	// together (Machine.key).
	machineType = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeEtherAddr)
	verdictMap  = nftables.TypeVerdict
)

func chainOf(t *nftables.Table, name string) *nftables.Chain {
	return &nftables.Chain{Table: t, Name: name}
}

// addChain is "add chain"; with flush, "flush chain" after it.
func (b *batch) addChain(t *nftables.Table, name string, flush bool) *nftables.Chain {
	c := b.c.AddChain(chainOf(t, name))
	if flush {
		b.c.FlushChain(c)
	}
	return c
}

// addBaseChain is "add chain T name { type typ hook h priority p; policy
// accept; }" and "flush chain T name".
func (b *batch) addBaseChain(t *nftables.Table, name string, typ nftables.ChainType, hook *nftables.ChainHook, prio int32) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	c := b.c.AddChain(&nftables.Chain{Table: t, Name: name, Type: typ, Hooknum: hook, Priority: nftables.ChainPriorityRef(nftables.ChainPriority(prio)), Policy: &accept})
	b.c.FlushChain(c)
	return c
}

// deleteChain is "add chain", "flush chain", "delete chain": whatever is
// left of it.
func (b *batch) deleteChain(t *nftables.Table, name string) {
	c := b.addChain(t, name, true)
	b.c.DelChain(c)
}

func (b *batch) rule(c *nftables.Chain, exprs ...[]expr.Any) {
	b.c.AddRule(&nftables.Rule{Table: c.Table, Chain: c, Exprs: slices.Concat(exprs...)})
}

func (b *batch) addSet(s *nftables.Set, elems []nftables.SetElement) *nftables.Set {
	if s.ID == 0 {
		s.ID = newSetID()
	}
	b.fail(b.c.AddSet(s, elems))
	return s
}

func (b *batch) addElements(s *nftables.Set, elems []nftables.SetElement) {
	if len(elems) > 0 {
		b.fail(b.c.SetAddElements(s, elems))
	}
}

func (b *batch) deleteElements(s *nftables.Set, elems []nftables.SetElement) {
	if len(elems) > 0 {
		b.fail(b.c.SetDeleteElements(s, elems))
	}
}

// The named sets and maps, as the kernel knows them.

func vmapSet(t *nftables.Table, name string, key nftables.SetDatatype) *nftables.Set {
	return &nftables.Set{Table: t, Name: name, IsMap: true, KeyType: key, DataType: verdictMap}
}

// egressVmap is "map bridge T egress_vmap { type ifname : verdict; }".
// Its names are strings, in host byte order as nft records them, or nft
// lists them empty.
func (b *batch) egressVmap() *nftables.Set {
	s := vmapSet(b.bridge, "egress_vmap", nftables.TypeIFName)
	s.KeyByteOrder = binaryutil.NativeEndian
	return s
}

// egress4 is "map inet T egress4 { type ipv4_addr . ether_addr : verdict;
// }".
func (b *batch) egress4() *nftables.Set { return vmapSet(b.inet, "egress4", machineType) }

// denied4 is "set inet T denied4 { type ipv4_addr; flags interval;
// auto-merge; }".
func (b *batch) denied4() *nftables.Set {
	return &nftables.Set{Table: b.inet, Name: "denied4", KeyType: nftables.TypeIPAddr, Interval: true, AutoMerge: true, KeyByteOrder: binaryutil.BigEndian}
}

// dnsSet is "set inet T dns_<port> { type ipv4_addr . ether_addr; }".
func (b *batch) dnsSet(e *Enforcer) *nftables.Set {
	return &nftables.Set{Table: b.inet, Name: e.dnsSet(), KeyType: machineType}
}

// sniMap is "map inet T sni_<port> { type ipv4_addr . ether_addr : verdict;
// }".
func (b *batch) sniMap(e *Enforcer) *nftables.Set {
	return vmapSet(b.inet, e.sniMap(), machineType)
}

// learned is "set inet T l4_<tap>_<grant> { type ipv4_addr; size 4096;
// flags timeout; }".
func (b *batch) learned(name string) *nftables.Set {
	return &nftables.Set{Table: b.inet, Name: name, KeyType: nftables.TypeIPAddr, HasTimeout: true, Size: 4096}
}

// recent is "set inet T dd_<tap>_<reason> { type ipv4_addr . inet_proto .
// inet_service; size 16; flags dynamic,timeout; timeout 60s; }".
func (b *batch) recent(tap, reason string) *nftables.Set {
	return &nftables.Set{Table: b.inet, Name: recentName(tap, reason), KeyType: recentType, Dynamic: true, HasTimeout: true, Timeout: recentWindow, Size: recentSize}
}

func (b *batch) counter(tap, reason string) *nftables.CounterObj {
	return &nftables.CounterObj{Table: b.inet, Name: counterName(tap, reason)}
}

// Elements.

func ip4Key(a netip.Addr) []byte { b := a.As4(); return b[:] }

// machineKey is "IP . MAC" as the kernel keys it: each component padded
// to 32 bits, the MAC's 6 bytes to 8.
func machineKey(ip netip.Addr, mac net.HardwareAddr) []byte {
	k := make([]byte, 12)
	copy(k, ip4Key(ip))
	copy(k[4:], mac)
	return k
}

// keysOf are elements of a set keyed by Machine.
func keysOf(keys ...[]byte) []nftables.SetElement {
	elems := make([]nftables.SetElement, len(keys))
	for i, k := range keys {
		elems[i] = nftables.SetElement{Key: k}
	}
	return elems
}

func ifnameKey(name string) []byte {
	k := make([]byte, unix.IFNAMSIZ)
	copy(k, name)
	return k
}

func gotoElement(key []byte, chain string) nftables.SetElement {
	return nftables.SetElement{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}}
}

func keys4(addrs []netip.Addr, timeout time.Duration) []nftables.SetElement {
	elems := make([]nftables.SetElement, len(addrs))
	for i, a := range addrs {
		elems[i] = nftables.SetElement{Key: ip4Key(a), Timeout: timeout}
	}
	return elems
}

// interval is an inclusive range of big-endian keys of one length.
type interval struct{ lo, hi []byte }

func prefixInterval(p netip.Prefix) interval {
	p = p.Masked()
	lo := ip4Key(p.Addr())
	hi := slices.Clone(lo)
	for i := range hi {
		bits := min(max(p.Bits()-8*i, 0), 8)
		hi[i] |= byte(0xff >> bits)
	}
	return interval{lo, hi}
}

func portInterval(p PortRange) interval {
	return interval{binary.BigEndian.AppendUint16(nil, p.Lo), binary.BigEndian.AppendUint16(nil, p.Hi)}
}

// next increments a big-endian key, reporting whether it wrapped.
func next(k []byte) ([]byte, bool) {
	n := slices.Clone(k)
	for i := len(n) - 1; i >= 0; i-- {
		n[i]++
		if n[i] != 0 {
			return n, false
		}
	}
	return n, true
}

// intervalElements encodes ranges as nft does for an interval set: each
// range's start, and the key after its end flagged as an end, adjacent
// and overlapping ranges merged; a zero end first unless a range starts
// at zero.
func intervalElements(ranges []interval) []nftables.SetElement {
	rs := slices.Clone(ranges)
	slices.SortFunc(rs, func(a, b interval) int { return slices.Compare(a.lo, b.lo) })
	var merged []interval
	for _, r := range rs {
		if n := len(merged); n > 0 {
			last := &merged[n-1]
			after, wrapped := next(last.hi)
			if wrapped || slices.Compare(r.lo, after) <= 0 {
				if slices.Compare(r.hi, last.hi) > 0 {
					last.hi = r.hi
				}
				continue
			}
		}
		merged = append(merged, r)
	}
	var elems []nftables.SetElement
	if len(merged) > 0 && slices.ContainsFunc(merged[0].lo, func(b byte) bool { return b != 0 }) {
		elems = append(elems, nftables.SetElement{Key: make([]byte, len(merged[0].lo)), IntervalEnd: true})
	}
	for _, r := range merged {
		elems = append(elems, nftables.SetElement{Key: r.lo})
		if end, wrapped := next(r.hi); !wrapped {
			elems = append(elems, nftables.SetElement{Key: end, IntervalEnd: true})
		}
	}
	return elems
}

// Expressions, register 1 unless told.

func meta(key expr.MetaKey, reg uint32) *expr.Meta { return &expr.Meta{Key: key, Register: reg} }

func cmp(op expr.CmpOp, data []byte) *expr.Cmp { return &expr.Cmp{Op: op, Register: 1, Data: data} }

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

var (
	accept = verdict(expr.VerdictAccept)
	drop   = verdict(expr.VerdictDrop)
	ret    = verdict(expr.VerdictReturn)
)

// ipv4Dep is the dependency of an IPv4 header field: "meta nfproto ipv4" in
// inet, "meta protocol ip" in bridge.
func ipv4Dep(family nftables.TableFamily) []expr.Any {
	if family == nftables.TableFamilyBridge {
		return []expr.Any{meta(expr.MetaKeyPROTOCOL, 1), cmp(expr.CmpOpEq, binaryutil.BigEndian.PutUint16(unix.ETH_P_IP))}
	}
	return []expr.Any{meta(expr.MetaKeyNFPROTO, 1), cmp(expr.CmpOpEq, []byte{unix.NFPROTO_IPV4})}
}

const (
	saddrOffset = 12
	daddrOffset = 16
	// etherSaddrOffset is where the source MAC is in the link header.
	etherSaddrOffset = 6
)

func ipField(offset, length uint32, reg uint32) *expr.Payload {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: length}
}

// sourceMachine loads "ip saddr . ether saddr" into registers 1 and 9 (a
// concatenation: each component from a 32-bit register of its own), with
// the dependencies nft gives it in inet: "meta nfproto ipv4" and "meta
// iiftype ether" (a packet from another kind of interface has no MAC
// header to read).
func sourceMachine() []expr.Any {
	return append(ipv4Dep(nftables.TableFamilyINet),
		meta(expr.MetaKeyIIFTYPE, 1), cmp(expr.CmpOpEq, binaryutil.NativeEndian.PutUint16(unix.ARPHRD_ETHER)),
		ipField(saddrOffset, 4, 1),
		&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseLLHeader, Offset: etherSaddrOffset, Len: 6})
}

// dport loads the transport header's destination port ("th dport").
func dport(reg uint32) *expr.Payload {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
}

// lookup matches register 1 in s: "@s".
func lookup(s *nftables.Set, invert bool) *expr.Lookup {
	return &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID, Invert: invert}
}

// prefixMatch is "ip saddr|daddr P" as nft compiles it: a prefix ending
// on a byte boundary compares the bytes it covers; another (0.0.0.0/0
// too) masks the address.
func prefixMatch(offset uint32, p netip.Prefix) []expr.Any {
	p = p.Masked()
	if n := uint32(p.Bits()) / 8; p.Bits()%8 == 0 && n > 0 {
		return []expr.Any{ipField(offset, n, 1), cmp(expr.CmpOpEq, ip4Key(p.Addr())[:n])}
	}
	mask := make([]byte, 4)
	for i := range mask {
		mask[i] = byte(0xff << min(max(8-(p.Bits()-8*i), 0), 8))
	}
	return []expr.Any{
		ipField(offset, 4, 1),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		cmp(expr.CmpOpEq, ip4Key(p.Addr())),
	}
}

// prefixMismatch is "ip saddr/daddr != P": prefixMatch's comparison
// turned round, as nft compiles it.
func prefixMismatch(offset uint32, p netip.Prefix) []expr.Any {
	m := prefixMatch(offset, p)
	last := *m[len(m)-1].(*expr.Cmp)
	last.Op = expr.CmpOpNeq
	return append(m[:len(m)-1:len(m)-1], &last)
}

// addrMatch is "ip daddr { N, ... }" (family's dependency first). As nft,
// a single element is matched by itself, several through an anonymous
// interval set created in the batch.
func (b *batch) addrMatch(t *nftables.Table, nets []netip.Prefix) []expr.Any {
	out := ipv4Dep(t.Family)
	if len(nets) == 1 {
		return append(out, prefixMatch(daddrOffset, nets[0])...)
	}
	ranges := make([]interval, len(nets))
	for i, n := range nets {
		ranges[i] = prefixInterval(n)
	}
	s := b.anonymous(t, nftables.TypeIPAddr, true, intervalElements(ranges))
	return append(out, ipField(daddrOffset, 4, 1), lookup(s, false))
}

// setMatch is "ip daddr @set".
func setMatch(t *nftables.Table, s *nftables.Set) []expr.Any {
	return append(ipv4Dep(t.Family), ipField(daddrOffset, 4, 1), lookup(s, false))
}

func (b *batch) anonymous(t *nftables.Table, key nftables.SetDatatype, isInterval bool, elems []nftables.SetElement) *nftables.Set {
	s := &nftables.Set{Table: t, Name: "__set%d", Anonymous: true, Constant: true, Interval: isInterval, KeyType: key, KeyByteOrder: binaryutil.BigEndian}
	return b.addSet(s, elems)
}

func protoElements(protos ...byte) []nftables.SetElement {
	elems := make([]nftables.SetElement, len(protos))
	for i, p := range protos {
		elems[i] = nftables.SetElement{Key: []byte{p}}
	}
	return elems
}

// l4protos is "meta l4proto { a, b }" ("!=" with invert).
func (b *batch) l4protos(t *nftables.Table, invert bool, protos ...byte) []expr.Any {
	s := b.anonymous(t, nftables.TypeInetProto, false, protoElements(protos...))
	return []expr.Any{meta(expr.MetaKeyL4PROTO, 1), lookup(s, invert)}
}

// l4proto is "meta l4proto p".
func l4proto(p byte) []expr.Any {
	return []expr.Any{meta(expr.MetaKeyL4PROTO, 1), cmp(expr.CmpOpEq, []byte{p})}
}

// portMatch is "th dport { P, ... }": one port by itself, one range by a
// range, several through an anonymous interval set.
func (b *batch) portMatch(t *nftables.Table, ports []PortRange) []expr.Any {
	out := []expr.Any{dport(1)}
	if len(ports) == 1 {
		p := ports[0]
		if p.Lo == p.Hi {
			return append(out, cmp(expr.CmpOpEq, binaryutil.BigEndian.PutUint16(p.Lo)))
		}
		return append(out, &expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: binaryutil.BigEndian.PutUint16(p.Lo), ToData: binaryutil.BigEndian.PutUint16(p.Hi)})
	}
	ranges := make([]interval, len(ports))
	for i, p := range ports {
		ranges[i] = portInterval(p)
	}
	s := b.anonymous(t, nftables.TypeInetService, true, intervalElements(ranges))
	return append(out, lookup(s, false))
}

// l4Match is l4's text: a grant's ports for TCP and UDP ("meta l4proto {
// tcp, udp } th dport { ... }"), UDP only under allowSNI, or without
// ports every protocol but ICMP ("meta l4proto != { icmp, ipv6-icmp }",
// "meta l4proto udp").
func (b *batch) l4Match(t *nftables.Table, g Grant) []expr.Any {
	var protos []expr.Any
	switch {
	case len(g.SNI) > 0:
		protos = l4proto(unix.IPPROTO_UDP)
	case len(g.Ports) == 0:
		return b.l4protos(t, true, unix.IPPROTO_ICMP, unix.IPPROTO_ICMPV6)
	default:
		protos = b.l4protos(t, false, unix.IPPROTO_TCP, unix.IPPROTO_UDP)
	}
	if len(g.Ports) == 0 {
		return protos
	}
	return append(protos, b.portMatch(t, g.Ports)...)
}

// tcpMatch is tcpPorts's text: "tcp dport { ... }", or "meta l4proto tcp".
func (b *batch) tcpMatch(t *nftables.Table, g Grant) []expr.Any {
	out := l4proto(unix.IPPROTO_TCP)
	if len(g.Ports) == 0 {
		return out
	}
	return append(out, b.portMatch(t, g.Ports)...)
}

// icmpEcho is "icmp type echo-request".
func icmpEcho() []expr.Any {
	return append(l4proto(unix.IPPROTO_ICMP),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		cmp(expr.CmpOpEq, []byte{8}))
}

// established is "ct state established,related".
func established() []expr.Any {
	mask := binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED)
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		cmp(expr.CmpOpNeq, make([]byte, 4)),
	}
}

// record is "add @s { ip daddr . meta l4proto . th dport }".
func record(s *nftables.Set) []expr.Any {
	return []expr.Any{
		ipField(daddrOffset, 4, 1),
		meta(expr.MetaKeyL4PROTO, 9),
		dport(10),
		&expr.Dynset{SrcRegKey: 1, SetName: s.Name, SetID: s.ID, Operation: unix.NFT_DYNSET_OP_ADD},
	}
}

// hasIPv4 tells whether a match starts with "meta nfproto ipv4".
func hasIPv4(match []expr.Any) bool {
	if len(match) < 2 {
		return false
	}
	m, ok := match[0].(*expr.Meta)
	return ok && m.Key == expr.MetaKeyNFPROTO
}

// countDrop is `counter name "c" drop`.
func countDrop(c *nftables.CounterObj) []expr.Any {
	return append([]expr.Any{&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: c.Name}}, drop...)
}

// redirect is "redirect to :port".
func redirect(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
	}
}

// vmapLookup is "vmap @m" of register 1.
func vmapLookup(m *nftables.Set) *expr.Lookup {
	return &expr.Lookup{SourceRegister: 1, IsDestRegSet: true, DestRegister: 0, SetName: m.Name, SetID: m.ID}
}

// setup adds the tables, base chains, maps and sets (setupScript's text).
func (b *batch) setup(e *Enforcer) {
	// add table bridge T
	b.c.AddTable(b.bridge)
	// add map bridge T egress_vmap { type ifname : verdict; }
	vmap := b.addSet(b.egressVmap(), nil)
	// add chain bridge T forward { type filter hook forward priority 10; policy accept; }
	// flush chain bridge T forward
	fwd := b.addBaseChain(b.bridge, "forward", nftables.ChainTypeFilter, nftables.ChainHookForward, 10)
	// add rule bridge T forward iifname vmap @egress_vmap
	b.rule(fwd, []expr.Any{meta(expr.MetaKeyIIFNAME, 1), vmapLookup(vmap)})

	// add table inet T
	b.c.AddTable(b.inet)
	// add map inet T egress4 { type ipv4_addr . ether_addr : verdict; }
	e4 := b.addSet(b.egress4(), nil)
	// add set inet T denied4 { type ipv4_addr; flags interval; auto-merge; }
	denied := b.addSet(b.denied4(), nil)
	// add chain inet T forward { type filter hook forward priority 10; policy accept; }
	// flush chain inet T forward
	fwd = b.addBaseChain(b.inet, "forward", nftables.ChainTypeFilter, nftables.ChainHookForward, 10)
	// add rule inet T forward ip saddr . ether saddr vmap @egress4
	b.rule(fwd, sourceMachine(), []expr.Any{vmapLookup(e4)})
	if e.DNSPort != 0 {
		// add set inet T dns_P { type ipv4_addr . ether_addr; }
		dns := b.addSet(b.dnsSet(e), nil)
		// add chain inet T dns_P { type nat hook prerouting priority -110; policy accept; }
		// flush chain inet T dns_P
		c := b.addBaseChain(b.inet, e.dnsSet(), nftables.ChainTypeNAT, nftables.ChainHookPrerouting, -110)
		// add rule inet T dns_P ip saddr . ether saddr @dns_P meta l4proto { tcp, udp } th dport 53 redirect to :P
		b.rule(c, sourceMachine(), []expr.Any{lookup(dns, false)},
			b.l4protos(b.inet, false, unix.IPPROTO_TCP, unix.IPPROTO_UDP),
			[]expr.Any{dport(1), cmp(expr.CmpOpEq, binaryutil.BigEndian.PutUint16(53))},
			redirect(e.DNSPort))
	}
	if e.SNIPort != 0 {
		// add map inet T sni_P { type ipv4_addr . ether_addr : verdict; }
		sni := b.addSet(b.sniMap(e), nil)
		// add chain inet T sni_P { type nat hook prerouting priority -110; policy accept; }
		// flush chain inet T sni_P
		c := b.addBaseChain(b.inet, e.sniMap(), nftables.ChainTypeNAT, nftables.ChainHookPrerouting, -110)
		// add rule inet T sni_P meta l4proto tcp ip saddr . ether saddr vmap @sni_P
		b.rule(c, l4proto(unix.IPPROTO_TCP), sourceMachine(), []expr.Any{vmapLookup(sni)})
	}
	if e.Masquerade != "" {
		// add chain inet T masq_U { type nat hook postrouting priority 100; policy accept; }
		// flush chain inet T masq_U
		c := b.addBaseChain(b.inet, "masq_"+e.Masquerade, nftables.ChainTypeNAT, nftables.ChainHookPostrouting, 100)
		// add rule inet T masq_U oifname "U" ip saddr N ip daddr != N masquerade
		// Not to the guest network: with guests on several nodes, a guest
		// on another node is reached through the uplink and must see the
		// sender's own address (its node routes the answer back, and
		// the namespace isolation goes by that address).
		b.rule(c, []expr.Any{meta(expr.MetaKeyOIFNAME, 1), cmp(expr.CmpOpEq, ifnameKey(e.Masquerade))},
			ipv4Dep(nftables.TableFamilyINet), prefixMatch(saddrOffset, e.Network.Masked()),
			prefixMismatch(daddrOffset, e.Network.Masked()), []expr.Any{&expr.Masq{}})
	}
	// add element inet T denied4 { N, always denied... }
	var denied4 []interval
	for _, p := range append([]netip.Prefix{e.Network.Masked()}, AlwaysDenied...) {
		if p.Addr().Is4() {
			denied4 = append(denied4, prefixInterval(p))
		}
	}
	b.addElements(denied, intervalElements(denied4))
}

// machine writes m's chains, sets and map entries (machineScript's text),
// deleting the learned sets in stale. noSNIEntry: the SNI map has no
// entry for m's key, so none is taken out first (lean's text). yielded:
// m's egress4 entry is left as it is, pointing at the chain of the other
// end of m's migration (see Enforcer.peerHolds).
//
// Unlike lean's text, the chains of a new Machine are flushed all the
// same: the kernel does that in microseconds, and it spares the
// transaction the question whether they exist (netlink has no "create
// chain" in github.com/google/nftables).
func (b *batch) machine(e *Enforcer, m Machine, p *Policy, stale []string, noSNIEntry, yielded bool) {
	tap := m.Tap
	// add chain bridge T e_TAP; flush chain bridge T e_TAP
	bc := b.addChain(b.bridge, "e_"+tap, true)
	for _, g := range p.Grants {
		if nets := nets4List(g.Nets, e.explicit, true); len(nets) > 0 {
			// add rule bridge T e_TAP ip daddr { explicit nets } accept
			b.rule(bc, b.addrMatch(b.bridge, nets), accept)
		}
	}
	// add rule bridge T e_TAP ether type arp accept
	b.rule(bc, []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 12, Len: 2},
		cmp(expr.CmpOpEq, binaryutil.BigEndian.PutUint16(unix.ETH_P_ARP)),
	}, accept)
	// add rule bridge T e_TAP drop
	b.rule(bc, drop)

	// add chain inet T e_TAP; flush chain inet T e_TAP
	ic := b.addChain(b.inet, "e_"+tap, true)
	learned := map[string]*nftables.Set{}
	for _, g := range p.Grants {
		if len(g.FQDNs) > 0 {
			// add set inet T l4_TAP_ID { type ipv4_addr; size 4096; flags timeout; }
			// Kept if it exists: an unchanged grant keeps what its guest
			// resolved. Bounded: a full set refuses the answer (SERVFAIL)
			// rather than grow with whatever a guest resolves.
			name := learnedSetName(tap, g.ID())
			learned[name] = b.addSet(b.learned(name), nil)
		}
	}
	recent := map[string]*nftables.Set{}
	counters := map[string]*nftables.CounterObj{}
	for _, r := range DenyReasons {
		// add counter inet T d_TAP_R
		counters[r] = b.counter(tap, r)
		b.c.AddObj(counters[r])
		// add set inet T dd_TAP_R { ...; flags dynamic,timeout; timeout 60s; }
		// The destinations dropped in the last minute, a few of them, for
		// the Machine's Warning event (DeniedDestinations).
		recent[r] = b.addSet(b.recent(tap, r), nil)
	}
	// deny drops what match matches, counting it under reason and
	// recording its destination: "add rule inet T e_TAP MATCH add
	// @dd_TAP_R { ip daddr . meta l4proto . th dport }", then "add rule
	// inet T e_TAP MATCH counter name "d_TAP_R" drop". The record is a
	// rule of its own: adding to a full set fails the rule, which must not
	// spare the packet.
	deny := func(match func() []expr.Any, reason string) {
		m := match()
		// The record's "ip daddr" needs "meta nfproto ipv4" unless the
		// match has it.
		var dep []expr.Any
		if !hasIPv4(m) {
			dep = ipv4Dep(nftables.TableFamilyINet)
		}
		b.rule(ic, m, dep, record(recent[reason]))
		b.rule(ic, match(), countDrop(counters[reason]))
	}
	// add rule inet T e_TAP ct state established,related accept
	b.rule(ic, established(), accept)
	rules := func(explicit bool) {
		for _, g := range p.Grants {
			// Each rule gets its own anonymous sets, so a destination is
			// built again for each rule that matches it.
			var dests []func() []expr.Any
			if nets := nets4List(g.Nets, e.explicit, explicit); len(nets) > 0 {
				dests = append(dests, func() []expr.Any { return b.addrMatch(b.inet, nets) })
			}
			if !explicit && len(g.FQDNs) > 0 {
				set := learned[learnedSetName(tap, g.ID())]
				dests = append(dests, func() []expr.Any { return setMatch(b.inet, set) })
			}
			for _, d := range dests {
				// add rule inet T e_TAP ip daddr D L4 accept
				b.rule(ic, d(), b.l4Match(b.inet, g), accept)
				if g.ICMP {
					// add rule inet T e_TAP ip daddr D icmp type echo-request accept
					b.rule(ic, d(), icmpEcho(), accept)
				}
			}
		}
	}
	rules(true)
	denied := b.denied4()
	deny(func() []expr.Any { return setMatch(b.inet, denied) }, ReasonIP)
	rules(false)
	// What no grant accepted, by why, for kairon_egress_denied_total:
	// meta l4proto { icmp, ipv6-icmp } (icmp), ip daddr of a grant (port),
	// meta nfproto ipv4 (ip).
	deny(func() []expr.Any { return b.l4protos(b.inet, false, unix.IPPROTO_ICMP, unix.IPPROTO_ICMPV6) }, ReasonICMP)
	for _, g := range p.Grants {
		if nets := nets4List(g.Nets, func(netip.Prefix) bool { return true }, true); len(nets) > 0 {
			deny(func() []expr.Any { return b.addrMatch(b.inet, nets) }, ReasonPort)
		}
		if len(g.FQDNs) > 0 {
			set := learned[learnedSetName(tap, g.ID())]
			deny(func() []expr.Any { return setMatch(b.inet, set) }, ReasonPort)
		}
	}
	deny(func() []expr.Any { return ipv4Dep(nftables.TableFamilyINet) }, ReasonIP)
	// add rule inet T e_TAP drop
	// Only IPv4 reaches this chain (the map is by IPv4 source); anything
	// else is dropped all the same rather than fall back to the base
	// chain's accept.
	b.rule(ic, drop)

	if e.SNIPort != 0 {
		b.sni(e, m, p, learned, noSNIEntry)
	}
	// Last: until both chains are rewritten, their old rules refer to
	// these sets, and the kernel refuses to delete a set in use.
	for _, name := range stale {
		// delete set inet T NAME
		b.c.DelSet(&nftables.Set{Table: b.inet, Name: name})
	}
	// add element bridge T egress_vmap { "TAP" : goto e_TAP }
	b.addElements(b.egressVmap(), []nftables.SetElement{gotoElement(ifnameKey(tap), "e_"+tap)})
	if !yielded {
		// add element inet T egress4 { IP . MAC : goto e_TAP }
		b.addElements(b.egress4(), []nftables.SetElement{gotoElement(m.key(), "e_"+tap)})
	}
	if e.DNSPort != 0 {
		// add element inet T dns_P { IP . MAC }
		b.addElements(b.dnsSet(e), keysOf(m.key()))
	}
}

// sni writes m's nat chain (sniScript's text): the TCP connections that
// only a grant with allowSNI allows go to the SNI proxy; those another
// grant allows without it pass on to the filter (union: a name check is a
// restriction of its own grant, never of another's). The chain follows
// the filter chain's order, so that what the filter drops is never
// redirected.
func (b *batch) sni(e *Enforcer, m Machine, p *Policy, learned map[string]*nftables.Set, noSNIEntry bool) {
	tap := m.Tap
	// add chain inet T s_TAP; flush chain inet T s_TAP
	c := b.addChain(b.inet, "s_"+tap, true)
	sni := b.sniMap(e)
	entry := []nftables.SetElement{gotoElement(m.key(), "s_"+tap)}
	if !noSNIEntry {
		// Out of the map first (added so that the delete cannot fail): a
		// policy without allowSNI leaves no entry behind.
		// add element inet T sni_P { IP . MAC : goto s_TAP }
		// delete element inet T sni_P { IP . MAC }
		b.addElements(sni, entry)
		b.deleteElements(sni, keysOf(m.key()))
	}
	if !hasSNI(p) {
		return
	}
	rules := func(explicit bool) {
		for _, checked := range []bool{false, true} {
			for _, g := range p.Grants {
				if (len(g.SNI) > 0) != checked {
					continue
				}
				verdict := ret
				if checked {
					verdict = redirect(e.SNIPort)
				}
				// add rule inet T s_TAP ip daddr D TCP return|redirect to :P
				if nets := nets4List(g.Nets, e.explicit, explicit); len(nets) > 0 {
					b.rule(c, b.addrMatch(b.inet, nets), b.tcpMatch(b.inet, g), verdict)
				}
				if !explicit && len(g.FQDNs) > 0 {
					b.rule(c, setMatch(b.inet, learned[learnedSetName(tap, g.ID())]), b.tcpMatch(b.inet, g), verdict)
				}
			}
		}
	}
	rules(true)
	// add rule inet T s_TAP ip daddr @denied4 return
	b.rule(c, setMatch(b.inet, b.denied4()), ret)
	rules(false)
	// add element inet T sni_P { IP . MAC : goto s_TAP }
	b.addElements(sni, entry)
}

// nets4List is what nets4 writes as text: the IPv4 nets whose
// explicitness is want.
func nets4List(nets []netip.Prefix, explicit func(netip.Prefix) bool, want bool) []netip.Prefix {
	var out []netip.Prefix
	for _, n := range nets {
		if n.Addr().Is4() && explicit(n) == want {
			out = append(out, n)
		}
	}
	return out
}

// forget takes the entries of key (a Machine's "IP . MAC") out
// (forgetKey's text). The egress4 entry goes only if it points at tap's
// chain (owner is the tap it points at in the kernel): in kairon-local a
// migration's source and target share the namespace and the guest's key,
// and the entry may be the other agent's by now; another Machine's entry
// has another key, so it is never touched. The DNS set and SNI map are
// this agent's own: never another tap's entry.
func (b *batch) forget(e *Enforcer, tap string, key []byte, owner string) {
	if owner == tap {
		// delete element inet T egress4 { IP . MAC }
		b.deleteElements(b.egress4(), keysOf(key))
	}
	if e.DNSPort != 0 {
		// add element inet T dns_P { IP . MAC }; delete element inet T dns_P { IP . MAC }
		b.addElements(b.dnsSet(e), keysOf(key))
		b.deleteElements(b.dnsSet(e), keysOf(key))
	}
	if e.SNIPort != 0 {
		// add chain inet T s_TAP
		// add element inet T sni_P { IP . MAC : goto s_TAP }; delete element inet T sni_P { IP . MAC }
		b.addChain(b.inet, "s_"+tap, false)
		b.addElements(b.sniMap(e), []nftables.SetElement{gotoElement(key, "s_"+tap)})
		b.deleteElements(b.sniMap(e), keysOf(key))
	}
}

// remove takes out everything of tap and of the Machine keys in owners
// (removeScript's text): each key maps to the tap its egress4 entry
// points at. Each object is added before it is deleted, so the batch
// succeeds whatever is left.
func (b *batch) remove(e *Enforcer, tap string, owners map[string]string, sets []string) {
	// add chain bridge T e_TAP
	b.addChain(b.bridge, "e_"+tap, false)
	// add element bridge T egress_vmap { "TAP" : goto e_TAP }; delete element ...
	b.addElements(b.egressVmap(), []nftables.SetElement{gotoElement(ifnameKey(tap), "e_"+tap)})
	b.deleteElements(b.egressVmap(), []nftables.SetElement{{Key: ifnameKey(tap)}})
	// flush chain bridge T e_TAP; delete chain bridge T e_TAP
	b.c.FlushChain(chainOf(b.bridge, "e_"+tap))
	b.c.DelChain(chainOf(b.bridge, "e_"+tap))
	// add chain inet T e_TAP
	b.addChain(b.inet, "e_"+tap, false)
	for _, key := range slices.Sorted(maps.Keys(owners)) {
		b.forget(e, tap, []byte(key), owners[key])
	}
	// flush chain inet T e_TAP; delete chain inet T e_TAP
	b.c.FlushChain(chainOf(b.inet, "e_"+tap))
	b.c.DelChain(chainOf(b.inet, "e_"+tap))
	// add chain inet T s_TAP; flush chain inet T s_TAP; delete chain inet T s_TAP
	b.deleteChain(b.inet, "s_"+tap)
	for _, name := range sets {
		// delete set inet T NAME
		b.c.DelSet(&nftables.Set{Table: b.inet, Name: name})
	}
	for _, r := range DenyReasons {
		// add counter inet T d_TAP_R; delete counter inet T d_TAP_R
		c := b.counter(tap, r)
		b.c.AddObj(c)
		b.c.DeleteObject(c)
		// add set inet T dd_TAP_R {...}; delete set inet T dd_TAP_R
		b.c.DelSet(b.addSet(b.recent(tap, r), nil))
	}
}

// learn allows addrs in the named learned sets for ttl. An element's
// timeout is not renewed by adding it again: add (so that the delete
// cannot fail), delete, add with the new one.
func (b *batch) learn(sets []string, addrs []netip.Addr, ttl time.Duration) {
	for _, name := range sets {
		s := b.learned(name)
		b.addElements(s, keys4(addrs, 0))
		b.deleteElements(s, keys4(addrs, 0))
		b.addElements(s, keys4(addrs, ttl))
	}
}

// dropAddressKeyed deletes the sets and maps of an older agent that were
// keyed by address alone, named in old (each with the base chain of the
// same name, or forward for egress4, which refers to it): setup, later in
// the same batch, creates them keyed by Machine. Their entries go with
// them; each agent writes its own again (Apply, or Repair at its next
// tick, which finds them missing).
func (b *batch) dropAddressKeyed(old []string) {
	for _, name := range old {
		chain := name
		if name == "egress4" {
			chain = "forward"
		}
		// flush chain inet T CHAIN; delete set inet T NAME
		b.c.FlushChain(chainOf(b.inet, chain))
		b.c.DelSet(&nftables.Set{Table: b.inet, Name: name})
	}
}

// removeTables is "add table; delete table" for both families.
func (b *batch) removeTables() {
	for _, t := range []*nftables.Table{b.bridge, b.inet} {
		b.c.AddTable(t)
		b.c.DelTable(t)
	}
}

// Reads.

// element is a set or map element as the kernel lists it.
type element struct {
	key []byte
	// chain is the chain a verdict map element jumps or goes to.
	chain string
	// expires is how long the element has left, if it times out.
	expires time.Duration
}

// elements dumps the elements of the inet or bridge table's set name.
// github.com/google/nftables does not decode verdicts of map elements,
// so the dump is read here.
func (s *session) elements(family nftables.TableFamily, set string) ([]element, error) {
	var out []element
	err := s.dump(family, unix.NFT_MSG_GETSETELEM, []netlink.Attribute{
		{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: []byte(Table + "\x00")},
		{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: []byte(set + "\x00")},
	}, func(ad *netlink.AttributeDecoder) {
		if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			return
		}
		ad.Nested(func(list *netlink.AttributeDecoder) error {
			for list.Next() {
				var el element
				list.Nested(func(a *netlink.AttributeDecoder) error {
					for a.Next() {
						switch a.Type() {
						case unix.NFTA_SET_ELEM_KEY:
							a.Nested(func(k *netlink.AttributeDecoder) error {
								for k.Next() {
									if k.Type() == unix.NFTA_DATA_VALUE {
										el.key = k.Bytes()
									}
								}
								return nil
							})
						case unix.NFTA_SET_ELEM_DATA:
							a.Nested(func(d *netlink.AttributeDecoder) error {
								for d.Next() {
									if d.Type() == unix.NFTA_DATA_VERDICT {
										d.Nested(func(v *netlink.AttributeDecoder) error {
											for v.Next() {
												if v.Type() == unix.NFTA_VERDICT_CHAIN {
													el.chain = v.String()
												}
											}
											return nil
										})
									}
								}
								return nil
							})
						case unix.NFTA_SET_ELEM_EXPIRATION:
							el.expires = time.Duration(a.Uint64()) * time.Millisecond
						}
					}
					return nil
				})
				out = append(out, el)
			}
			return nil
		})
	})
	return out, err
}

// dump sends a dump request of type msg and hands each attribute of each
// reply to each.
func (s *session) dump(family nftables.TableFamily, msg int, attrs []netlink.Attribute, each func(*netlink.AttributeDecoder)) error {
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return err
	}
	if s.dumper == nil {
		// The batch socket of the nftables Conn is not reachable: one of
		// its own, in the same namespace.
		cfg := &netlink.Config{}
		if s.ns != nil {
			cfg.NetNS = int(s.ns.Fd())
		}
		if s.dumper, err = netlink.Dial(unix.NETLINK_NETFILTER, cfg); err != nil {
			return err
		}
	}
	replies, err := s.dumper.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msg),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: append([]byte{byte(family), unix.NFNETLINK_V0, 0, 0}, data...),
	})
	if err != nil {
		if !errors.Is(err, unix.ENOENT) {
			s.broken = true
		}
		return err
	}
	for _, r := range replies {
		if len(r.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(r.Data[4:])
		if err != nil {
			return err
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			each(ad)
		}
		if err := ad.Err(); err != nil {
			return err
		}
	}
	return nil
}

// addressKeyed lists those of egress4, dns_<port> and sni_<port> that the
// kernel holds keyed by address alone (an agent before Machine keys wrote
// them), and whose base chain exists: Setup replaces them.
func (s *session) addressKeyed(e *Enforcer) ([]string, error) {
	names := []string{"egress4"}
	if e.DNSPort != 0 {
		names = append(names, e.dnsSet())
	}
	if e.SNIPort != 0 {
		names = append(names, e.sniMap())
	}
	chains, err := s.chainNames(nftables.TableFamilyINet)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("egress: listing the chains of table inet %s: %w", Table, err)
	}
	keyLens, err := s.keyLengths()
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("egress: listing the sets of table inet %s: %w", Table, err)
	}
	var old []string
	for _, name := range names {
		chain := name
		if name == "egress4" {
			chain = "forward"
		}
		if n, ok := keyLens[name]; ok && n != machineType.Bytes && slices.Contains(chains, chain) {
			old = append(old, name)
		}
	}
	return old, nil
}

// keyLengths maps the inet table's sets to their key lengths. Read here:
// github.com/google/nftables decodes a verdict map's key type as the
// verdict type.
func (s *session) keyLengths() (map[string]uint32, error) {
	lens := map[string]uint32{}
	var name string
	err := s.dump(nftables.TableFamilyINet, unix.NFT_MSG_GETSET, []netlink.Attribute{
		{Type: unix.NFTA_SET_TABLE, Data: []byte(Table + "\x00")},
	}, func(ad *netlink.AttributeDecoder) {
		switch ad.Type() {
		case unix.NFTA_SET_NAME:
			name = ad.String()
		case unix.NFTA_SET_KEY_LEN:
			lens[name] = ad.Uint32()
		}
	})
	return lens, err
}

// pinnedTo tells whether the bridge baseline (internal/node/network) pins
// tap to mac: its chain g_<tap> drops what the tap sends from any other
// source MAC ("ether saddr != MAC drop").
func (s *session) pinnedTo(tap string, mac net.HardwareAddr) bool {
	t := &nftables.Table{Family: nftables.TableFamilyBridge, Name: network.BaselineTable}
	rules, err := s.conn.GetRules(t, chainOf(t, "g_"+tap))
	if err != nil {
		if !errors.Is(err, unix.ENOENT) {
			s.broken = true
		}
		return false
	}
	for _, r := range rules {
		for i := 0; i+1 < len(r.Exprs); i++ {
			p, isPayload := r.Exprs[i].(*expr.Payload)
			c, isCmp := r.Exprs[i+1].(*expr.Cmp)
			if isPayload && isCmp && p.Base == expr.PayloadBaseLLHeader && p.Offset == etherSaddrOffset && p.Len == 6 &&
				c.Op == expr.CmpOpNeq && bytes.Equal(c.Data, mac) {
				return true
			}
		}
	}
	return false
}

// setNames lists the names of the inet table's sets.
func (s *session) setNames() ([]string, error) {
	var names []string
	err := s.dump(nftables.TableFamilyINet, unix.NFT_MSG_GETSET, []netlink.Attribute{
		{Type: unix.NFTA_SET_TABLE, Data: []byte(Table + "\x00")},
	}, func(ad *netlink.AttributeDecoder) {
		if ad.Type() == unix.NFTA_SET_NAME {
			names = append(names, ad.String())
		}
	})
	return names, err
}

// chainNames lists the chains of the family's table.
func (s *session) chainNames(family nftables.TableFamily) ([]string, error) {
	var names []string
	var table string
	err := s.dump(family, unix.NFT_MSG_GETCHAIN, []netlink.Attribute{
		{Type: unix.NFTA_CHAIN_TABLE, Data: []byte(Table + "\x00")},
	}, func(ad *netlink.AttributeDecoder) {
		switch ad.Type() {
		case unix.NFTA_CHAIN_TABLE:
			table = ad.String()
		case unix.NFTA_CHAIN_NAME:
			if table == Table {
				names = append(names, ad.String())
			}
		}
	})
	return names, err
}
