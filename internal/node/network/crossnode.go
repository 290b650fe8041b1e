package network

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"sort"
	"strings"
	"time"
)

// CrossNodeMode is how a node reaches the guest subnets of other nodes.
type CrossNodeMode string

const (
	// CrossNodeNone installs nothing: guests reach only their own node's
	// guests (and those on a bridge shared with other agents, kairon-local).
	CrossNodeNone CrossNodeMode = "none"
	// CrossNodeHost routes each peer's subnet to the peer's address, as
	// Flannel's host-gw does: the nodes must share one link (no router
	// between them), and the guests' addresses travel unchanged on it.
	CrossNodeHost CrossNodeMode = "host"
	// CrossNodeVXLAN routes each peer's subnet through a VXLAN device whose
	// frames go to the peer's address in UDP, as Flannel's vxlan backend
	// does: the nodes need only reach each other's addresses, through any
	// routers.
	CrossNodeVXLAN CrossNodeMode = "vxlan"
)

// ParseCrossNodeMode reads the --cross-node-routing flag.
func ParseCrossNodeMode(s string) (CrossNodeMode, error) {
	switch m := CrossNodeMode(s); m {
	case CrossNodeNone, CrossNodeHost, CrossNodeVXLAN:
		return m, nil
	}
	return "", fmt.Errorf("--cross-node-routing %q: must be none, host or vxlan", s)
}

// RouteProtocol tags every route the agent installs for other nodes'
// guests (the routing protocol number of `ip route ... proto`), so that it
// finds and removes them, and only them, after a restart.
const RouteProtocol = 75

// VXLANDevice is the VXLAN device of the vxlan mode. It does not start
// with TapPrefix: it is no guest.
const VXLANDevice = "kairon-vx"

// VXLANMTU is the VXLAN device's MTU, as Flannel's: 1500 less the
// encapsulation.
const VXLANMTU = 1450

// Peer is another node whose guests this node routes to.
type Peer struct {
	Node string
	// Subnet is the peer's guest subnet, Address where its guests' traffic
	// goes: the next hop (host) or the VXLAN tunnel's far end (vxlan).
	Subnet  netip.Prefix
	Address netip.Addr
}

// MovedGuest is a guest running on a node that is not its subnet's
// (it migrated there): a host route for its address follows it, as
// Calico's do. Node is the node it runs on.
type MovedGuest struct {
	Address netip.Addr
	Node    string
}

// CrossNode keeps the routes to other nodes' guests in the node's network
// namespace, with iproute2.
type CrossNode struct {
	NetNS  string
	Bridge string
	// Node is this node; Local is its own address between nodes (the VXLAN
	// tunnels' near end).
	Node  string
	Local netip.Addr
	Mode  CrossNodeMode
	// VNI and Port are the VXLAN network id and UDP port (vxlan mode).
	VNI  int
	Port int
}

// VTEPMAC is the VXLAN device's address on node: derived from its name, so
// peers know it without asking.
func VTEPMAC(node string) string {
	sum := sha256.Sum256([]byte("vtep/" + node))
	return fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", sum[0], sum[1], sum[2], sum[3], sum[4])
}

// vtep is the address a peer's subnet is routed through on the VXLAN
// device: the subnet's own first address, which no guest has (Flannel's
// choice). It is only a key for the permanent neighbour entry that names
// the peer's VXLAN MAC; nothing is addressed to it.
func vtep(p Peer) netip.Addr { return p.Subnet.Addr() }

// Setup turns on what routing between nodes needs in the namespace:
// forwarding, proxy ARP on the bridge (guests see the whole cluster range
// as their link and ask for every address of it; the node answers for
// those it routes elsewhere) and, in vxlan mode, the VXLAN device.
func (c *CrossNode) Setup() error {
	if c.Mode == CrossNodeNone || c.Mode == "" {
		return nil
	}
	links := &Links{NetNS: c.NetNS, Bridge: c.Bridge}
	if err := links.sysctl("net/ipv4/ip_forward", "1"); err != nil {
		return err
	}
	if err := links.sysctl("net/ipv4/conf/"+c.Bridge+"/proxy_arp", "1"); err != nil {
		return err
	}
	// The kernel answers only for addresses routed out of another device
	// (a guest of the bridge answers for itself), and by default delays
	// each answer by up to 0.8 s, which a guest's first packet to another
	// node would wait for: answer at once.
	if err := links.sysctl("net/ipv4/neigh/"+c.Bridge+"/proxy_delay", "0"); err != nil {
		return err
	}
	if c.Mode != CrossNodeVXLAN {
		return nil
	}
	if !c.Local.Is4() {
		return fmt.Errorf("--cross-node-routing=vxlan: this node's address between nodes %v is not IPv4 (--cross-node-address)", c.Local)
	}
	if c.vxlanMatches() {
		return nil
	}
	_ = c.ip("link", "del", VXLANDevice)
	if err := c.ip("link", "add", VXLANDevice, "type", "vxlan", "id", fmt.Sprint(c.VNI), "local", c.Local.String(),
		"dstport", fmt.Sprint(c.Port), "nolearning"); err != nil {
		return err
	}
	// Room for the 50 bytes of VXLAN, UDP, IP and Ethernet around each
	// frame on a 1500-byte underlay (the kernel leaves a device without a
	// lower one at 1500, and the outer packets would be fragmented).
	if err := c.ip("link", "set", VXLANDevice, "mtu", fmt.Sprint(VXLANMTU), "address", VTEPMAC(c.Node)); err != nil {
		return err
	}
	return c.ip("link", "set", VXLANDevice, "up")
}

// vxlanMatches tells whether the VXLAN device exists with this node's
// parameters (a restarted agent keeps it, and the guests' traffic flows on).
func (c *CrossNode) vxlanMatches() bool {
	out, err := c.output("ip", "-j", "-d", "link", "show", "dev", VXLANDevice)
	if err != nil {
		return false
	}
	var links []struct {
		Address  string `json:"address"`
		MTU      int    `json:"mtu"`
		Flags    []string
		LinkInfo struct {
			Kind string `json:"info_kind"`
			Data struct {
				ID    int    `json:"id"`
				Local string `json:"local"`
				Port  int    `json:"port"`
			} `json:"info_data"`
		} `json:"linkinfo"`
	}
	if json.Unmarshal([]byte(out), &links) != nil || len(links) != 1 {
		return false
	}
	l := links[0]
	up := false
	for _, f := range l.Flags {
		up = up || f == "UP"
	}
	return up && l.MTU == VXLANMTU && l.LinkInfo.Kind == "vxlan" && l.LinkInfo.Data.ID == c.VNI && l.LinkInfo.Data.Local == c.Local.String() &&
		l.LinkInfo.Data.Port == c.Port && l.Address == VTEPMAC(c.Node)
}

// Routes is what Sync would install: destination → `ip route replace`
// arguments after the destination.
func (c *CrossNode) Routes(peers []Peer, moved []MovedGuest) map[netip.Prefix][]string {
	routes := map[netip.Prefix][]string{}
	byNode := map[string]Peer{}
	via := func(p Peer) []string {
		if c.Mode == CrossNodeVXLAN {
			return []string{"via", vtep(p).String(), "dev", VXLANDevice, "onlink"}
		}
		return []string{"via", p.Address.String()}
	}
	for _, p := range peers {
		if p.Node == c.Node || !p.Subnet.IsValid() || !p.Address.Is4() {
			continue
		}
		byNode[p.Node] = p
		routes[p.Subnet.Masked()] = via(p)
	}
	for _, m := range moved {
		if !m.Address.Is4() {
			continue
		}
		dst := netip.PrefixFrom(m.Address, 32)
		if m.Node == c.Node {
			// Here, but in a peer's subnet: the bridge, ahead of the
			// route to the peer.
			routes[dst] = []string{"dev", c.Bridge, "scope", "link"}
		} else if p, ok := byNode[m.Node]; ok {
			routes[dst] = via(p)
		}
	}
	return routes
}

// Sync makes the namespace's routes (and, in vxlan mode, the tunnel's
// neighbour and forwarding entries) exactly those for peers and moved:
// what is missing is added, what no longer is (a peer gone, a guest that
// left) is removed.
func (c *CrossNode) Sync(peers []Peer, moved []MovedGuest) error {
	if c.Mode == CrossNodeNone || c.Mode == "" {
		return nil
	}
	want := c.Routes(peers, moved)
	have, err := c.installedRoutes()
	if err != nil {
		return err
	}
	var batch []string
	if c.Mode == CrossNodeVXLAN {
		// Neighbours first: a route through the tunnel needs its peer's MAC.
		if err := c.syncTunnel(peers); err != nil {
			return err
		}
	}
	for _, dst := range have {
		if _, ok := want[dst]; !ok {
			batch = append(batch, fmt.Sprintf("route del %s proto %d", dst, RouteProtocol))
		}
	}
	dsts := make([]netip.Prefix, 0, len(want))
	for dst := range want {
		dsts = append(dsts, dst)
	}
	sort.Slice(dsts, func(i, j int) bool { return dsts[i].String() < dsts[j].String() })
	for _, dst := range dsts {
		batch = append(batch, fmt.Sprintf("route replace %s %s proto %d", dst, strings.Join(want[dst], " "), RouteProtocol))
	}
	if err := c.batch("ip", batch); err != nil {
		return err
	}
	// A guest that just moved to another node: the guests of this bridge
	// that cached its MAC are told to send to the node instead.
	installed := map[netip.Prefix]bool{}
	for _, dst := range have {
		installed[dst] = true
	}
	var errs []error
	for _, m := range moved {
		dst := netip.PrefixFrom(m.Address, 32)
		if m.Node != c.Node && want[dst] != nil && !installed[dst] {
			errs = append(errs, AnnounceGateway(c.NetNS, c.Bridge, m.Address))
			go c.announceAgain(m.Address)
		}
	}
	return errors.Join(errs...)
}

// announceAgain repeats a moved guest's announcement, as QEMU repeats a
// migrated guest's: Linux ignores an ARP that would change a neighbour
// entry within a second of its last change (locktime), and an ARP can be
// lost. A failure here is no news: the first announcement's was reported.
func (c *CrossNode) announceAgain(addrs ...netip.Addr) {
	for _, after := range []time.Duration{1500 * time.Millisecond, 3 * time.Second} {
		time.Sleep(after)
		for _, addr := range addrs {
			_ = AnnounceGateway(c.NetNS, c.Bridge, addr)
		}
	}
}

// AnnounceElsewhere announces addrs, guests that are not on this node, at
// the bridge's MAC, now and twice again. A guest that just arrived from
// another node still has its former bridge neighbours' own MACs in its
// ARP cache: its frames to them would find no such port here and be lost
// until the entries expired, tens of seconds. The announcement turns the
// entries to the node, which routes to the neighbours' node; a guest
// without such an entry ignores it.
func (c *CrossNode) AnnounceElsewhere(addrs []netip.Addr) error {
	if c.Mode == CrossNodeNone || c.Mode == "" || len(addrs) == 0 {
		return nil
	}
	var errs []error
	for _, addr := range addrs {
		errs = append(errs, AnnounceGateway(c.NetNS, c.Bridge, addr))
	}
	go c.announceAgain(addrs...)
	return errors.Join(errs...)
}

// installedRoutes lists the destinations of the routes tagged RouteProtocol.
func (c *CrossNode) installedRoutes() ([]netip.Prefix, error) {
	out, err := c.output("ip", "-j", "-4", "route", "show", "proto", fmt.Sprint(RouteProtocol))
	if err != nil {
		return nil, err
	}
	var routes []struct {
		Dst string `json:"dst"`
	}
	if err := json.Unmarshal([]byte(out), &routes); err != nil {
		return nil, fmt.Errorf("cross-node routes: reading ip -j route: %w", err)
	}
	var dsts []netip.Prefix
	for _, r := range routes {
		dst, err := netip.ParsePrefix(r.Dst)
		if err != nil {
			addr, err := netip.ParseAddr(r.Dst)
			if err != nil {
				continue
			}
			dst = netip.PrefixFrom(addr, 32)
		}
		dsts = append(dsts, dst)
	}
	return dsts, nil
}

// syncTunnel keeps one permanent neighbour (peer's vtep address → its VXLAN
// MAC) and one forwarding entry (that MAC → the peer's address) per peer on
// the VXLAN device, and no other.
func (c *CrossNode) syncTunnel(peers []Peer) error {
	wantNeigh := map[string]string{} // vtep address → MAC
	wantFDB := map[string]string{}   // MAC → peer address
	for _, p := range peers {
		if p.Node == c.Node || !p.Subnet.IsValid() || !p.Address.Is4() {
			continue
		}
		wantNeigh[vtep(p).String()] = VTEPMAC(p.Node)
		wantFDB[VTEPMAC(p.Node)] = p.Address.String()
	}
	out, err := c.output("ip", "-j", "-4", "neigh", "show", "dev", VXLANDevice)
	if err != nil {
		return err
	}
	var neighs []struct {
		Dst    string `json:"dst"`
		LLAddr string `json:"lladdr"`
	}
	if err := json.Unmarshal([]byte(out), &neighs); err != nil {
		return fmt.Errorf("cross-node tunnel: reading ip -j neigh: %w", err)
	}
	var ipBatch []string
	for _, n := range neighs {
		if wantNeigh[n.Dst] != n.LLAddr {
			ipBatch = append(ipBatch, fmt.Sprintf("neigh del %s dev %s", n.Dst, VXLANDevice))
		}
	}
	for dst, mac := range wantNeigh {
		ipBatch = append(ipBatch, fmt.Sprintf("neigh replace %s lladdr %s dev %s nud permanent", dst, mac, VXLANDevice))
	}
	out, err = c.output("bridge", "-j", "fdb", "show", "dev", VXLANDevice)
	if err != nil {
		return err
	}
	var fdb []struct {
		MAC string `json:"mac"`
		Dst string `json:"dst"`
	}
	if err := json.Unmarshal([]byte(out), &fdb); err != nil {
		return fmt.Errorf("cross-node tunnel: reading bridge -j fdb: %w", err)
	}
	var bridgeBatch []string
	for _, e := range fdb {
		if e.Dst != "" && wantFDB[e.MAC] != e.Dst {
			bridgeBatch = append(bridgeBatch, fmt.Sprintf("fdb del %s dev %s dst %s self", e.MAC, VXLANDevice, e.Dst))
		}
	}
	for mac, dst := range wantFDB {
		bridgeBatch = append(bridgeBatch, fmt.Sprintf("fdb replace %s dev %s dst %s self permanent", mac, VXLANDevice, dst))
	}
	if err := c.batch("bridge", bridgeBatch); err != nil {
		return err
	}
	return c.batch("ip", ipBatch)
}

// Teardown removes every route tagged RouteProtocol and the VXLAN device
// (its neighbours and forwarding entries go with it). Forwarding and proxy
// ARP stay on: other agents of the namespace may need them.
func (c *CrossNode) Teardown() error {
	have, err := c.installedRoutes()
	if err != nil {
		return err
	}
	var batch []string
	for _, dst := range have {
		batch = append(batch, fmt.Sprintf("route del %s proto %d", dst, RouteProtocol))
	}
	if err := c.batch("ip", batch); err != nil {
		return err
	}
	if _, err := c.output("ip", "link", "show", "dev", VXLANDevice); err == nil {
		return c.ip("link", "del", VXLANDevice)
	}
	return nil
}

func (c *CrossNode) ip(args ...string) error {
	_, err := c.output("ip", args...)
	return err
}

// output runs an iproute2 command (ip or bridge) in the namespace.
func (c *CrossNode) output(command string, args ...string) (string, error) {
	if c.NetNS != "" {
		args = append([]string{"-n", c.NetNS}, args...)
	}
	out, err := exec.Command(command, args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %s: %v: %s", command, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// batch runs lines with one `command -batch -`; -force goes on past a
// failed line, so one bad peer does not keep the others' routes out.
func (c *CrossNode) batch(command string, lines []string) error {
	if len(lines) == 0 {
		return nil
	}
	args := []string{"-force", "-batch", "-"}
	if c.NetNS != "" {
		args = append([]string{"-n", c.NetNS}, args...)
	}
	cmd := exec.Command(command, args...)
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("cross-node routes (netns %q): %s -batch: %v: %s", c.NetNS, command, err, strings.TrimSpace(out.String()))
	}
	return nil
}
