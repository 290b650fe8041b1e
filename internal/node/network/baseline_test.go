package network

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/netlab"
)

// blockedWindow is how long a packet the baseline must drop is given to
// show up anyway. Dropped traffic has no event to wait for, so this is
// real time by nature (as testenv.Consistently's window); every such check
// comes after a positive control on the same path.
const blockedWindow = 2 * time.Second

// waitTimeout bounds waits for something that must happen (a connection, a
// neighbour entry); tests pass as soon as it does.
const waitTimeout = 20 * time.Second

func TestBaselineScripts(t *testing.T) {
	g := Guest{Tap: "kt0123456789", Namespace: "team-a", MAC: "52:54:00:aa:bb:cc", IP: netip.MustParseAddr("10.88.1.2")}
	cases := []struct {
		name   string
		script string
		want   []string
	}{
		{"setup", setupScript("kairon0", netip.MustParsePrefix("10.88.0.0/16"), netip.MustParseAddr("10.88.0.1"), []uint16{5353, 0, 5354}), []string{
			"add chain bridge kairon prerouting { type filter hook prerouting priority -200; policy accept; }\nflush chain bridge kairon prerouting\n",
			"add rule bridge kairon prerouting iifname vmap @guest_vmap\nadd rule bridge kairon prerouting iifname \"kt*\" drop\n",
			"add rule bridge kairon forward iifname vmap @forward_vmap\nadd rule bridge kairon forward iifname \"kt*\" drop\n",
			"add rule bridge kairon output oifname @guests ip saddr @guest_networks ip saddr != @gateways drop\n",
			"add element bridge kairon guest_networks { 10.88.0.0/16 }\n",
			"add element bridge kairon gateways { 10.88.0.1 }\n",
			"add rule inet kairon input iifname @bridges ct state established,related accept\n" +
				"add rule inet kairon input iifname @bridges meta l4proto { tcp, udp } th dport @proxy_ports ct status dnat accept\n" +
				"add rule inet kairon input iifname @bridges icmp type echo-request ip daddr @gateways accept\n" +
				"add rule inet kairon input iifname @bridges reject with icmpx admin-prohibited\n",
			"add element inet kairon bridges { \"kairon0\" }\nadd element inet kairon gateways { 10.88.0.1 }\n",
			"add rule bridge kairon output oifname \"kt*\" ether type != { ip, arp } drop\nadd rule bridge kairon output oifname vmap @output_vmap\n",
			"add rule inet kairon output oifname \"kt*\" meta nfproto ipv6 drop\n",
			"add element bridge kairon metadata { 169.254.0.0/16, 100.100.100.200, 168.63.129.16, 192.0.0.192 }\n",
			"add element inet kairon proxy_ports { 5353 }\nadd element inet kairon proxy_ports { 5354 }\n",
		}},
		{"guest", (&Baseline{Node: "node-1"}).guestScript(g), []string{
			"add chain bridge kairon g_kt0123456789\nflush chain bridge kairon g_kt0123456789\n" +
				"add rule bridge kairon g_kt0123456789 ether saddr != 52:54:00:aa:bb:cc drop\n" +
				"add rule bridge kairon g_kt0123456789 ether type != { ip, arp } drop\n",
			"add rule bridge kairon g_kt0123456789 arp saddr ether != 52:54:00:aa:bb:cc drop\n" +
				"add rule bridge kairon g_kt0123456789 arp saddr ip != 10.88.1.2 drop\n",
			"add rule bridge kairon g_kt0123456789 ip saddr != 10.88.1.2 drop\nadd rule bridge kairon g_kt0123456789 ip daddr @metadata drop\nadd rule bridge kairon g_kt0123456789 jump p_kt0123456789\n",
			"add rule bridge kairon o_kt0123456789 ip saddr @ips_team-a_" + agentTag("node-1") + " accept\n" +
				"add rule bridge kairon o_kt0123456789 ip saddr @guest_networks ip saddr != @gateways jump peers_team-a\n" +
				"add rule bridge kairon o_kt0123456789 ip saddr @guest_networks ip saddr != @gateways drop\n",
			"add rule bridge kairon f_kt0123456789 oifname @guests oifname != @ns_team-a drop\n",
			"add element bridge kairon ns_team-a { \"kt0123456789\" }\n",
			"add element bridge kairon guest_vmap { \"kt0123456789\" : goto g_kt0123456789 }\n",
			"add element bridge kairon forward_vmap { \"kt0123456789\" : goto f_kt0123456789 }\n",
		}},
		{"remove", removeScript("kt0123456789", "team-a"), []string{
			"add element bridge kairon guest_vmap { \"kt0123456789\" : goto g_kt0123456789 }\ndelete element bridge kairon guest_vmap { \"kt0123456789\" }\n",
			"add element bridge kairon ns_team-a { \"kt0123456789\" }\ndelete element bridge kairon ns_team-a { \"kt0123456789\" }\n",
			"flush chain bridge kairon p_kt0123456789\ndelete chain bridge kairon p_kt0123456789\n",
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, want := range c.want {
				if !strings.Contains(c.script, want) {
					t.Errorf("script lacks\n%s\nscript:\n%s", want, c.script)
				}
			}
		})
	}
	// The policy chain belongs to the egress work: re-applying a guest's
	// baseline must not flush it.
	if strings.Contains((&Baseline{}).guestScript(g), "flush chain bridge kairon p_") {
		t.Error("guestScript flushes the policy chain")
	}
}

func TestBaselineRefusesWhatIsNotAName(t *testing.T) {
	good := Guest{Tap: "kt0123456789", Namespace: "team-a", MAC: "52:54:00:aa:bb:cc", IP: netip.MustParseAddr("10.88.1.2")}
	cases := []struct {
		name   string
		mutate func(*Guest)
		field  string
	}{
		{"namespace with nft syntax", func(g *Guest) { g.Namespace = "a }; flush ruleset; add set x {" }, "namespace"},
		{"namespace upper case", func(g *Guest) { g.Namespace = "Team" }, "namespace"},
		{"namespace too long", func(g *Guest) { g.Namespace = strings.Repeat("a", 64) }, "namespace"},
		{"tap with a quote", func(g *Guest) { g.Tap = `kt" accept` }, "tap"},
		{"tap of another prefix", func(g *Guest) { g.Tap = "eth0" }, "tap"},
		{"tap too long", func(g *Guest) { g.Tap = "kt0123456789abcd" }, "tap"},
		{"multicast MAC", func(g *Guest) { g.MAC = "01:00:5e:00:00:01" }, "MAC"},
		{"MAC with syntax", func(g *Guest) { g.MAC = "52:54:00:aa:bb:cc drop" }, "MAC"},
		{"IPv6 address", func(g *Guest) { g.IP = netip.MustParseAddr("fe80::1") }, "address"},
		{"no address", func(g *Guest) { g.IP = netip.Addr{} }, "address"},
	}
	if err := good.validate(); err != nil {
		t.Fatalf("valid guest refused: %v", err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := good
			c.mutate(&g)
			err := g.validate()
			if err == nil || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("validate(%+v) = %v, want an error naming the %s", g, err, c.field)
			}
			b := &Baseline{applied: map[string]Guest{}}
			if err := b.Ensure(g); err == nil {
				t.Fatal("Ensure accepted it")
			}
		})
	}
	if err := (&Baseline{applied: map[string]Guest{}}).Remove("kt0123456789", "x;y"); err == nil {
		t.Error("Remove accepted a namespace that is not a label")
	}
}

// testNet is a node network in a namespace of its own: a bridge, the
// baseline, and guests as veth pairs whose guest ends live in their own
// namespaces, registered as the agent registers taps.
type testNet struct {
	host     string
	bridge   string
	network  netip.Prefix
	gateway  netip.Addr
	baseline *Baseline
}

type testGuest struct {
	netns string
	Guest
}

func newTestNet(t *testing.T, node string) *testNet {
	t.Helper()
	n := &testNet{
		host:    testNetNS(t),
		bridge:  "kbr0",
		network: netip.MustParsePrefix("10.88.0.0/16"),
		gateway: netip.MustParseAddr("10.88.0.1"),
	}
	run(t, "ip", "-n", n.host, "link", "set", "lo", "up")
	links := &Links{Bridge: n.bridge, Gateway: netip.PrefixFrom(n.gateway, 16), NetNS: n.host, Node: node}
	if err := links.EnsureBridge(); err != nil {
		t.Fatal(err)
	}
	n.baseline = n.agent(t, node)
	return n
}

// agent is one more node agent's baseline on the network: node's (a new
// one, or one restarting).
func (n *testNet) agent(t *testing.T, node string) *Baseline {
	t.Helper()
	return n.agentWith(t, &Baseline{Node: node})
}

// agentWith sets up b, given its node and options, on the network.
func (n *testNet) agentWith(t *testing.T, b *Baseline) *Baseline {
	t.Helper()
	b.NetNS, b.Bridge, b.Network, b.Gateway = n.host, n.bridge, n.network, n.gateway
	if err := b.Setup(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := RemoveBaseline(n.host); err != nil {
			t.Error(err)
		}
	})
	return b
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// guest adds a Machine of namespace/name with address ip on node, through
// b (the node's agent).
func (n *testNet) guest(t *testing.T, b *Baseline, node, namespace, name, ip string) *testGuest {
	t.Helper()
	id := namespace + "_" + name
	g := &testGuest{netns: testNetNS(t), Guest: Guest{Tap: TapName(node, id), Namespace: namespace, MAC: MAC(id), IP: netip.MustParseAddr(ip)}}
	run(t, "ip", "-n", n.host, "link", "add", g.Tap, "type", "veth", "peer", "name", "eth0", "netns", g.netns)
	run(t, "ip", "-n", n.host, "link", "set", g.Tap, "master", n.bridge, "up")
	run(t, "ip", "-n", g.netns, "link", "set", "lo", "up")
	run(t, "ip", "-n", g.netns, "link", "set", "eth0", "address", g.MAC)
	run(t, "ip", "-n", g.netns, "addr", "add", ip+"/16", "dev", "eth0")
	run(t, "ip", "-n", g.netns, "link", "set", "eth0", "up")
	run(t, "ip", "-n", g.netns, "route", "add", "default", "via", n.gateway.String())
	if err := b.Ensure(g.Guest); err != nil {
		t.Fatal(err)
	}
	return g
}

// inNetNS runs fn on a thread in network namespace ns; sockets fn opens
// stay there. The thread is never unlocked, so Go discards it afterwards
// instead of reusing it in the wrong namespace.
func inNetNS(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open("/var/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// serveTCP listens on addr in ns and answers every connection with "hi".
func serveTCP(t *testing.T, ns, addr string) {
	t.Helper()
	netlab.ServeGreeting(t, ns, addr, "hi")
}

// dialTCP connects from ns to addr and reads the greeting.
func dialTCP(ns, addr string, timeout time.Duration) error {
	return netlab.DialGreeting(ns, addr, "hi", timeout)
}

func mustReach(t *testing.T, from *testGuest, addr string) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, from.Tap+" reaching "+addr, func() (bool, string) {
		err := dialTCP(from.netns, addr, time.Second)
		return err == nil, fmt.Sprint(err)
	})
}

func mustNotReach(t *testing.T, ns, what, addr string) {
	t.Helper()
	if err := dialTCP(ns, addr, blockedWindow); err == nil {
		t.Fatalf("%s connected to %s", what, addr)
	}
}

// udpReceiver listens on addr in ns and hands over what it receives.
func udpReceiver(t *testing.T, ns, addr string) <-chan string {
	t.Helper()
	var conn *net.UDPConn
	if err := inNetNS(ns, func() error {
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
		conn = c
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	got := make(chan string, 1024)
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				close(got)
				return
			}
			got <- from.Addr().String() + " " + string(buf[:n])
		}
	}()
	return got
}

// sendUDP sends payload from (address, port 0 if unset) in ns to addr.
func sendUDP(ns, from, to, payload string) error {
	return inNetNS(ns, func() error {
		laddr := &net.UDPAddr{IP: net.ParseIP(from)}
		c, err := net.DialUDP("udp", laddr, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(to)))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(payload))
		return err
	})
}

// untilMarker reads got until a datagram with marker arrives and returns
// what came before it.
func untilMarker(t *testing.T, got <-chan string, marker string) []string {
	t.Helper()
	var before []string
	timeout := time.After(waitTimeout)
	for {
		select {
		case m, ok := <-got:
			if !ok {
				t.Fatal("receiver closed")
			}
			if strings.HasSuffix(m, " "+marker) {
				return before
			}
			before = append(before, m)
		case <-timeout:
			t.Fatalf("marker %q never arrived (got %v)", marker, before)
		}
	}
}

func TestBaselineDropsSpoofedFrames(t *testing.T) {
	n := newTestNet(t, "node-1")
	// One namespace: what is dropped here is dropped for spoofing, not for
	// isolation.
	attacker := n.guest(t, n.baseline, "node-1", "team-a", "attacker", "10.88.1.2")
	victim := n.guest(t, n.baseline, "node-1", "team-a", "victim", "10.88.1.3")
	receiver := n.guest(t, n.baseline, "node-1", "team-a", "receiver", "10.88.1.4")
	receiverMAC := receiver.MAC
	serveTCP(t, receiver.netns, "10.88.1.4:7000")
	mustReach(t, victim, "10.88.1.4:7000")
	mustReach(t, attacker, "10.88.1.4:7000")

	got := udpReceiver(t, receiver.netns, "10.88.1.4:7001")
	// A static neighbour: the attacker's datagrams do not wait for an ARP
	// answer, so a drop shows the IP check, not a failed resolution.
	run(t, "ip", "-n", attacker.netns, "neigh", "replace", "10.88.1.4", "lladdr", receiverMAC, "dev", "eth0", "nud", "permanent")

	t.Run("another guest's IP", func(t *testing.T) {
		run(t, "ip", "-n", attacker.netns, "addr", "add", "10.88.1.3/32", "dev", "eth0")
		defer run(t, "ip", "-n", attacker.netns, "addr", "del", "10.88.1.3/32", "dev", "eth0")
		for i := range 20 {
			if err := sendUDP(attacker.netns, "10.88.1.3", "10.88.1.4:7001", fmt.Sprint("spoof-ip-", i)); err != nil {
				t.Fatal(err)
			}
		}
		// Same sender, same path: the marker arrives after anything sent
		// before it that was let through.
		if err := sendUDP(attacker.netns, "10.88.1.2", "10.88.1.4:7001", "marker-ip"); err != nil {
			t.Fatal(err)
		}
		if before := untilMarker(t, got, "marker-ip"); len(before) > 0 {
			t.Fatalf("the receiver got datagrams with a spoofed source address: %v", before)
		}
	})

	t.Run("another guest's MAC", func(t *testing.T) {
		run(t, "ip", "-n", attacker.netns, "link", "set", "eth0", "address", victim.MAC)
		restored := false
		defer func() {
			if !restored {
				run(t, "ip", "-n", attacker.netns, "link", "set", "eth0", "address", attacker.MAC)
			}
		}()
		for i := range 20 {
			if err := sendUDP(attacker.netns, "10.88.1.2", "10.88.1.4:7001", fmt.Sprint("spoof-mac-", i)); err != nil {
				t.Fatal(err)
			}
		}
		run(t, "ip", "-n", attacker.netns, "link", "set", "eth0", "address", attacker.MAC)
		restored = true
		if err := sendUDP(attacker.netns, "10.88.1.2", "10.88.1.4:7001", "marker-mac"); err != nil {
			t.Fatal(err)
		}
		if before := untilMarker(t, got, "marker-mac"); len(before) > 0 {
			t.Fatalf("the receiver got datagrams sent with another guest's MAC: %v", before)
		}
	})

	t.Run("frames that are not IPv4 or ARP", func(t *testing.T) {
		// Checks on the IPv4 header do not look inside a VLAN tag, and
		// IPv6 or other EtherTypes have none of those checks: a guest
		// could carry anything in them, unless they are dropped whole.
		sniffed := sniff(t, receiver.netns)
		ipv4 := ipv4UDP(attacker.IP, receiver.IP, []byte("token-in-vlan"))
		frames := map[string][]byte{
			"802.1Q-tagged IPv4":  ethernet(receiverMAC, attacker.MAC, 0x8100, append([]byte{0x00, 0x05, 0x08, 0x00}, ipv4...)),
			"802.1ad-tagged IPv4": ethernet(receiverMAC, attacker.MAC, 0x88a8, append([]byte{0x00, 0x05, 0x08, 0x00}, ipv4...)),
			"IPv6":                ethernet(receiverMAC, attacker.MAC, 0x86dd, append(make([]byte, 40), []byte("token-ipv6")...)),
			"local EtherType":     ethernet(receiverMAC, attacker.MAC, 0x88b5, []byte("token-experimental")),
		}
		for what, frame := range frames {
			if err := sendFrame(attacker.netns, frame); err != nil {
				t.Fatalf("sending %s: %v", what, err)
			}
		}
		if err := sendUDP(attacker.netns, "10.88.1.2", "10.88.1.4:7001", "marker-raw"); err != nil {
			t.Fatal(err)
		}
		if before := untilMarker(t, got, "marker-raw"); len(before) > 0 {
			t.Fatalf("datagrams before the marker: %v", before)
		}
		// The sniffer sees frames in the order they arrived: everything the
		// attacker sent came before the marker.
		timeout := time.After(waitTimeout)
		for seen := false; !seen; {
			select {
			case frame := <-sniffed:
				if bytes.Contains(frame, []byte("token-")) {
					t.Fatalf("the receiver got a frame the baseline must drop: % x", frame)
				}
				seen = bytes.Contains(frame, []byte("marker-raw"))
			case <-timeout:
				t.Fatal("the sniffer never saw the marker")
			}
		}
	})

	t.Run("ARP for another guest's IP", func(t *testing.T) {
		// The victim is silent, the attacker holds its address: only the
		// attacker can answer the receiver's ARP request.
		run(t, "ip", "-n", victim.netns, "link", "set", "eth0", "down")
		run(t, "ip", "-n", attacker.netns, "addr", "add", "10.88.1.3/32", "dev", "eth0")
		defer func() {
			run(t, "ip", "-n", attacker.netns, "addr", "del", "10.88.1.3/32", "dev", "eth0")
			run(t, "ip", "-n", victim.netns, "link", "set", "eth0", "up")
		}()
		run(t, "ip", "-n", receiver.netns, "neigh", "flush", "dev", "eth0")
		_ = dialTCP(receiver.netns, "10.88.1.3:7000", blockedWindow)
		var entry string
		testenv.Eventually(t, waitTimeout, "the receiver's ARP resolution of 10.88.1.3 to finish", func() (bool, string) {
			out, _ := exec.Command("ip", "-n", receiver.netns, "neigh", "show", "10.88.1.3", "dev", "eth0").CombinedOutput()
			entry = strings.TrimSpace(string(out))
			return !strings.Contains(entry, "INCOMPLETE"), entry
		})
		if strings.Contains(entry, attacker.MAC) {
			t.Fatalf("the attacker's ARP answer for the victim's address got through: %s", entry)
		}
	})

	// The victim was never hurt by any of it.
	mustReach(t, victim, "10.88.1.4:7000")
}

func TestBaselineIsolatesNamespaces(t *testing.T) {
	n := newTestNet(t, "node-1")
	a1 := n.guest(t, n.baseline, "node-1", "team-a", "one", "10.88.1.2")
	a2 := n.guest(t, n.baseline, "node-1", "team-a", "two", "10.88.1.3")
	b1 := n.guest(t, n.baseline, "node-1", "team-b", "one", "10.88.1.4")
	b2 := n.guest(t, n.baseline, "node-1", "team-b", "two", "10.88.1.5")
	for _, g := range []*testGuest{a1, b1} {
		serveTCP(t, g.netns, g.IP.String()+":7000")
	}
	mustReach(t, a2, "10.88.1.2:7000")
	mustReach(t, b2, "10.88.1.4:7000")
	mustNotReach(t, b1.netns, "a guest of team-b", "10.88.1.2:7000")
	mustNotReach(t, a1.netns, "a guest of team-a", "10.88.1.4:7000")

	// Nor through the host: the guest routes the other's address via the
	// gateway, and the node forwards IP (as Kubernetes nodes do).
	run(t, "ip", "netns", "exec", n.host, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	run(t, "ip", "-n", b1.netns, "route", "add", "10.88.1.2/32", "via", n.gateway.String())
	got := udpReceiver(t, a1.netns, "10.88.1.2:7001")
	if err := sendUDP(a2.netns, "", "10.88.1.2:7001", "same-namespace"); err != nil {
		t.Fatal(err)
	}
	if m := <-got; !strings.HasSuffix(m, "same-namespace") {
		t.Fatalf("a1 received %q", m)
	}
	for i := range 10 {
		if err := sendUDP(b1.netns, "", "10.88.1.2:7001", fmt.Sprint("routed-", i)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case m := <-got:
		t.Fatalf("a guest of team-b reached team-a through the host: %q", m)
	case <-time.After(blockedWindow):
	}
}

func TestBaselineKeepsGuestsOffTheNode(t *testing.T) {
	n := newTestNet(t, "node-1")
	g := n.guest(t, n.baseline, "node-1", "team-a", "one", "10.88.1.2")
	peer := n.guest(t, n.baseline, "node-1", "team-a", "two", "10.88.1.3")
	// The node's other address (its InternalIP) on another interface.
	run(t, "ip", "-n", n.host, "link", "add", "node0", "type", "veth", "peer", "name", "node0p")
	run(t, "ip", "-n", n.host, "addr", "add", "192.168.77.1/24", "dev", "node0")
	run(t, "ip", "-n", n.host, "link", "set", "node0", "up")
	run(t, "ip", "-n", n.host, "link", "set", "node0p", "up")
	services := []string{
		n.gateway.String() + ":10250", // console port, say
		n.gateway.String() + ":10251", // migration port
		"192.168.77.1:6443",           // the API server on the node address
	}
	for _, s := range services {
		serveTCP(t, n.host, s)
		if err := dialTCP(n.host, s, waitTimeout); err != nil {
			t.Fatalf("the node itself cannot reach %s: %v", s, err)
		}
	}
	// The guest is on the network: it reaches its neighbour, and the node
	// reaches the guest (the replies come back).
	serveTCP(t, peer.netns, "10.88.1.3:7000")
	mustReach(t, g, "10.88.1.3:7000")
	serveTCP(t, g.netns, "10.88.1.2:8080")
	testenv.Eventually(t, waitTimeout, "the node reaching the guest", func() (bool, string) {
		err := dialTCP(n.host, "10.88.1.2:8080", time.Second)
		return err == nil, fmt.Sprint(err)
	})
	// And it pings the gateway: the path to the node works, only the
	// node's services are closed to it. The node's other addresses do not
	// answer even that: they would tell the guest about the host.
	testenv.Eventually(t, waitTimeout, "the guest's ping of the gateway answered", func() (bool, string) {
		err := ping(g.netns, n.gateway)
		return err == nil, fmt.Sprint(err)
	})
	if err := pingWithin(g.netns, netip.MustParseAddr("192.168.77.1"), blockedWindow); err == nil {
		t.Error("the guest's ping of the node's other address was answered")
	}
	for _, s := range services {
		err := dialTCP(g.netns, s, waitTimeout)
		if err == nil {
			t.Errorf("the guest connected to the node's %s", s)
			continue
		}
		// Refused by the baseline at once, not left to time out.
		if !errors.Is(err, unix.EHOSTUNREACH) && !errors.Is(err, unix.ECONNREFUSED) {
			t.Errorf("the guest's connection to %s failed with %v, want the baseline's refusal", s, err)
		}
	}
}

func TestBaselineRemovesOnlyItsOwn(t *testing.T) {
	n := newTestNet(t, "node-1")
	node2 := n.agent(t, "node-2")
	// Two agents registering many taps at once on one bridge.
	var wg sync.WaitGroup
	var mine, theirs []Guest
	for i := range 8 {
		for _, a := range []struct {
			node string
			b    *Baseline
			list *[]Guest
		}{{"node-1", n.baseline, &mine}, {"node-2", node2, &theirs}} {
			ns := []string{"team-a", "team-b"}[i%2]
			id := fmt.Sprintf("%s_m%d", ns, i)
			g := Guest{Tap: TapName(a.node, id), Namespace: ns, MAC: MAC(id), IP: netip.MustParseAddr(fmt.Sprintf("10.88.%s.%d", a.node[len(a.node)-1:], 10+i))}
			*a.list = append(*a.list, g)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := a.b.Ensure(g); err != nil {
					t.Error(err)
				}
			}()
		}
	}
	wg.Wait()
	listing := func() string {
		out, err := n.baseline.output("list", "table", "bridge", BaselineTable)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	all := listing()
	for _, g := range append(append([]Guest{}, mine...), theirs...) {
		for _, want := range []string{"chain g_" + g.Tap + " {", "chain f_" + g.Tap + " {", "chain p_" + g.Tap + " {", "\"" + g.Tap + "\" : goto g_" + g.Tap} {
			if !strings.Contains(all, want) {
				t.Errorf("after concurrent Ensure, the ruleset lacks %q", want)
			}
		}
	}

	// Many entries, wrapped as nft prints them: still seen as intact.
	for _, b := range []*Baseline{n.baseline, node2} {
		if repaired, err := b.Repair(); err != nil || repaired {
			t.Errorf("Repair of an intact baseline with %d taps: %v, %v", 16, repaired, err)
		}
	}

	// node-1's agent restarts: it finds its taps and can remove them.
	restarted := n.agent(t, "node-1")
	for _, g := range mine {
		if err := restarted.Remove(g.Tap, g.Namespace); err != nil {
			t.Fatal(err)
		}
	}
	left := listing()
	for _, g := range mine {
		if strings.Contains(left, g.Tap) {
			t.Errorf("removed tap %s is still in the ruleset:\n%s", g.Tap, left)
		}
	}
	for _, g := range theirs {
		if !strings.Contains(left, "chain g_"+g.Tap+" {") || !strings.Contains(left, "\""+g.Tap+"\" : goto f_"+g.Tap) {
			t.Errorf("node-2's tap %s lost its baseline when node-1 removed its own", g.Tap)
		}
	}
	for _, set := range []string{"set ns_team-a {", "set ns_team-b {"} {
		if !strings.Contains(left, set) {
			t.Errorf("%s is gone while node-2 has guests in it", set)
		}
	}

	// The last guests of a namespace take its set with them.
	for _, g := range theirs {
		if g.Namespace == "team-b" {
			if err := node2.Remove(g.Tap, g.Namespace); err != nil {
				t.Fatal(err)
			}
		}
	}
	if left := listing(); strings.Contains(left, "ns_team-b") || !strings.Contains(left, "set ns_team-a {") {
		t.Errorf("after team-b's last guest left:\n%s", left)
	}
	// Removing twice, or what was never there, is quiet.
	if err := node2.Remove(theirs[1].Tap, theirs[1].Namespace); err != nil {
		t.Fatal(err)
	}
	if err := node2.Remove(TapName("node-2", "team-c_x"), "team-c"); err != nil {
		t.Fatal(err)
	}

	if err := RemoveBaseline(n.host); err != nil {
		t.Fatal(err)
	}
	if out, _ := n.baseline.output("list", "tables"); strings.Contains(out, BaselineTable) {
		t.Errorf("tables left after RemoveBaseline: %s", out)
	}
	if err := RemoveBaseline(n.host); err != nil {
		t.Fatalf("RemoveBaseline twice: %v", err)
	}
}

func TestBaselineDropsUnregisteredTaps(t *testing.T) {
	n := newTestNet(t, "node-1")
	g := n.guest(t, n.baseline, "node-1", "team-a", "one", "10.88.1.2")
	peer := n.guest(t, n.baseline, "node-1", "team-a", "two", "10.88.1.3")
	serveTCP(t, peer.netns, "10.88.1.3:7000")
	mustReach(t, g, "10.88.1.3:7000")
	if err := n.baseline.Remove(g.Tap, g.Namespace); err != nil {
		t.Fatal(err)
	}
	// A tap without a baseline (removed, or not yet set up) sends nothing.
	mustNotReach(t, g.netns, "a guest whose baseline was removed", "10.88.1.3:7000")
}

func TestBaselineRepairsWhatWasFlushed(t *testing.T) {
	n := newTestNet(t, "node-1")
	a := n.guest(t, n.baseline, "node-1", "team-a", "one", "10.88.1.2")
	b := n.guest(t, n.baseline, "node-1", "team-b", "one", "10.88.1.3")
	serveTCP(t, a.netns, "10.88.1.2:7000")
	if repaired, err := n.baseline.Repair(); err != nil || repaired {
		t.Fatalf("Repair of an intact baseline: %v, %v; want nothing to do", repaired, err)
	}
	for _, tamper := range [][]string{
		{"flush", "ruleset"},
		{"flush", "chain", "bridge", BaselineTable, "g_" + b.Tap},
		{"delete", "element", "bridge", BaselineTable, "forward_vmap", "{ " + b.Tap + " }"},
		{"delete", "table", "inet", BaselineTable},
	} {
		t.Run(strings.Join(tamper, " "), func(t *testing.T) {
			run(t, append([]string{"ip", "netns", "exec", n.host, "nft"}, tamper...)...)
			if tamper[1] == "ruleset" {
				mustReach(t, b, "10.88.1.2:7000") // the hole is real
			}
			repaired, err := n.baseline.Repair()
			if err != nil || !repaired {
				t.Fatalf("Repair after %v: %v, %v; want it repaired", tamper, repaired, err)
			}
			if repaired, err := n.baseline.Repair(); err != nil || repaired {
				t.Fatalf("second Repair: %v, %v; want nothing to do", repaired, err)
			}
			mustNotReach(t, b.netns, "a guest of team-b after the repair", "10.88.1.2:7000")
		})
	}
}

// ethernet builds a frame.
func ethernet(dst, src string, etherType uint16, payload []byte) []byte {
	d, _ := net.ParseMAC(dst)
	s, _ := net.ParseMAC(src)
	frame := append(append([]byte{}, d...), s...)
	frame = binary.BigEndian.AppendUint16(frame, etherType)
	return append(frame, payload...)
}

// ipv4UDP builds an IPv4 packet carrying a UDP datagram to port 7001.
func ipv4UDP(src, dst netip.Addr, payload []byte) []byte {
	udp := binary.BigEndian.AppendUint16(nil, 40000)
	udp = binary.BigEndian.AppendUint16(udp, 7001)
	udp = binary.BigEndian.AppendUint16(udp, uint16(8+len(payload)))
	udp = append(udp, 0, 0) // no checksum
	udp = append(udp, payload...)
	ip := []byte{0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0}
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(udp)))
	s, d := src.As4(), dst.As4()
	ip = append(append(ip, s[:]...), d[:]...)
	var sum uint32
	for i := 0; i < len(ip); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	return append(ip, udp...)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// sendFrame puts frame on eth0 of ns as it is.
func sendFrame(ns string, frame []byte) error {
	return inNetNS(ns, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6, Addr: [8]byte(append(append([]byte{}, frame[:6]...), 0, 0))})
	})
}

// sniff hands over every frame eth0 of ns receives, in order, until the
// test ends.
func sniff(t *testing.T, ns string) <-chan []byte {
	t.Helper()
	var fd int
	if err := inNetNS(ns, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100_000}); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index})
	}); err != nil {
		t.Fatal(err)
	}
	frames := make(chan []byte, 4096)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(frames)
		buf := make([]byte, 65536)
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				continue // the receive timeout, to look at stop
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			frames <- append([]byte{}, buf[:n]...)
		}
	}()
	t.Cleanup(func() { close(stop); <-done; unix.Close(fd) })
	return frames
}

// ping sends one ICMP echo request from ns to addr and waits a second for
// the reply.
func ping(ns string, addr netip.Addr) error {
	return pingWithin(ns, addr, time.Second)
}

// pingWithin sends one ICMP echo request from ns to addr and waits timeout
// for the reply.
func pingWithin(ns string, addr netip.Addr, timeout time.Duration) error {
	return inNetNS(ns, func() error {
		c, err := net.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return err
		}
		defer c.Close()
		msg := []byte{8, 0, 0, 0, 0x4b, 0x41, 0, 1, 'k', 'a', 'i', 'r', 'o', 'n'}
		var sum uint32
		for i := 0; i+1 < len(msg); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(msg[i:]))
		}
		for sum > 0xffff {
			sum = sum&0xffff + sum>>16
		}
		binary.BigEndian.PutUint16(msg[2:], ^uint16(sum))
		if _, err := c.WriteTo(msg, &net.IPAddr{IP: addr.AsSlice()}); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(timeout))
		buf := make([]byte, 1500)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return err
			}
			// An echo reply (type 0) to this request, from addr.
			if from.String() == addr.String() && n >= 8 && buf[0] == 0 && bytes.Equal(buf[4:8], msg[4:8]) {
				return nil
			}
		}
	})
}
