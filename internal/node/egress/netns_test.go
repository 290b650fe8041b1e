package egress

import (
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/zyvor/kairon/internal/node/network"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/netlab"
)

// blockedWindow is how long a connection that must fail is given anyway.
// Dropped packets have no event to wait for; every such check follows a
// positive control on the same path.
const blockedWindow = 2 * time.Second

const waitTimeout = 20 * time.Second

// Test addresses: the "outside" is a namespace the test creates, linked to
// the node namespace; nothing leaves the namespaces.
const (
	uplinkNode    = "198.51.100.1"
	uplinkOutside = "198.51.100.2"
	pkgAddr       = "203.0.113.10"
	otherAddr     = "203.0.113.20"
	metadataAddr  = "169.254.169.254"
)

// testNode is a node network in namespaces of its own: a bridge with the
// guest baseline and the egress tables, veth "guests", and an outside
// namespace reached through the node.
type testNode struct {
	host, outside string
	bridge        string
	network       netip.Prefix
	gateway       netip.Addr
	baseline      *network.Baseline
	enforcer      *Enforcer
}

type testGuest struct {
	netns string
	Machine
}

func testNetNS(t *testing.T) string {
	t.Helper()
	return netlab.Namespace(t, "kairon-egress")
}

func run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func newTestNode(t *testing.T) *testNode {
	t.Helper()
	n := &testNode{
		host:    testNetNS(t),
		outside: testNetNS(t),
		bridge:  "kbr0",
		network: netip.MustParsePrefix("10.88.0.0/16"),
		gateway: netip.MustParseAddr("10.88.0.1"),
	}
	for _, ns := range []string{n.host, n.outside} {
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	links := &network.Links{Bridge: n.bridge, Gateway: netip.PrefixFrom(n.gateway, 16), NetNS: n.host, Node: "node-1"}
	if err := links.EnsureBridge(); err != nil {
		t.Fatal(err)
	}
	run(t, "ip", "netns", "exec", n.host, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	run(t, "ip", "-n", n.host, "link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns", n.outside)
	run(t, "ip", "-n", n.host, "addr", "add", uplinkNode+"/24", "dev", "up0")
	run(t, "ip", "-n", n.host, "link", "set", "up0", "up")
	run(t, "ip", "-n", n.outside, "addr", "add", uplinkOutside+"/24", "dev", "eth0")
	run(t, "ip", "-n", n.outside, "link", "set", "eth0", "up")
	for _, a := range []string{pkgAddr, otherAddr, metadataAddr} {
		run(t, "ip", "-n", n.outside, "addr", "add", a+"/32", "dev", "lo")
		run(t, "ip", "-n", n.host, "route", "add", a+"/32", "via", uplinkOutside)
	}
	run(t, "ip", "-n", n.outside, "route", "add", n.network.String(), "via", uplinkNode)

	// What the egress tables do with link-local is under test here; the
	// baseline's own metadata drop (network.MetadataAddresses) would hide
	// it, so this node allows metadata as --allow-guest-metadata does.
	n.baseline = &network.Baseline{NetNS: n.host, Bridge: n.bridge, Network: n.network, Gateway: n.gateway, AllowMetadata: true}
	if err := n.baseline.Setup(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := network.RemoveBaseline(n.host); err != nil {
			t.Error(err)
		}
	})
	n.enforcer = n.newEnforcer(t)
	t.Cleanup(func() {
		if err := RemoveTables(n.host); err != nil {
			t.Error(err)
		}
	})
	return n
}

// newEnforcer is a node agent's enforcer, as one (re)starting would make.
func (n *testNode) newEnforcer(t *testing.T) *Enforcer {
	t.Helper()
	e := &Enforcer{NetNS: n.host, Bridge: n.bridge, Network: n.network, Gateway: n.gateway}
	if err := e.Setup(); err != nil {
		t.Fatal(err)
	}
	return e
}

func (n *testNode) guest(t *testing.T, namespace, name, ip string) *testGuest {
	t.Helper()
	id := namespace + "_" + name
	mac := network.MAC(id)
	g := &testGuest{netns: testNetNS(t), Machine: Machine{Namespace: namespace, Name: name, Tap: network.TapName("node-1", id), MAC: mac, IP: netip.MustParseAddr(ip)}}
	run(t, "ip", "-n", n.host, "link", "add", g.Tap, "type", "veth", "peer", "name", "eth0", "netns", g.netns)
	run(t, "ip", "-n", n.host, "link", "set", g.Tap, "master", n.bridge, "up")
	run(t, "ip", "-n", g.netns, "link", "set", "lo", "up")
	run(t, "ip", "-n", g.netns, "link", "set", "eth0", "address", mac)
	run(t, "ip", "-n", g.netns, "addr", "add", ip+"/16", "dev", "eth0")
	run(t, "ip", "-n", g.netns, "link", "set", "eth0", "up")
	run(t, "ip", "-n", g.netns, "route", "add", "default", "via", n.gateway.String())
	if err := n.baseline.Ensure(network.Guest{Tap: g.Tap, Namespace: namespace, MAC: mac, IP: g.IP}); err != nil {
		t.Fatal(err)
	}
	return g
}

// macOf is the MAC the agent gives Machine namespace/name.
func macOf(namespace, name string) string { return network.MAC(namespace + "_" + name) }

// serveTCP listens on addr in ns and answers every connection with "hi".
func serveTCP(t *testing.T, ns, addr string) {
	t.Helper()
	netlab.ServeGreeting(t, ns, addr, "hi")
}

func dialTCP(ns, addr string, timeout time.Duration) error {
	return netlab.DialGreeting(ns, addr, "hi", timeout)
}

func mustReach(t *testing.T, g *testGuest, addr string) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, g.Name+" reaching "+addr, func() (bool, string) {
		err := dialTCP(g.netns, addr, time.Second)
		return err == nil, fmt.Sprint(err)
	})
}

func mustNotReach(t *testing.T, g *testGuest, addr string) {
	t.Helper()
	if err := dialTCP(g.netns, addr, blockedWindow); err == nil {
		t.Fatalf("%s connected to %s", g.Name, addr)
	}
}

// ping sends one ICMP echo request from ns to addr and waits for the reply.
func ping(ns, addr string) error {
	return inNetNS(ns, func() error {
		c, err := icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return err
		}
		defer c.Close()
		msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: mathrand.IntN(0xffff), Seq: 1, Data: []byte("kairon")}}
		b, err := msg.Marshal(nil)
		if err != nil {
			return err
		}
		dst := &net.IPAddr{IP: net.ParseIP(addr)}
		if _, err := c.WriteTo(b, dst); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(blockedWindow))
		buf := make([]byte, 1500)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return err
			}
			m, err := icmp.ParseMessage(1, buf[:n])
			if err == nil && m.Type == ipv4.ICMPTypeEchoReply && from.String() == addr {
				return nil
			}
		}
	})
}

var counts = regexp.MustCompile(`packets \d+ bytes \d+`)

// expiries are the kernel's countdowns of timed set elements.
var expiries = regexp.MustCompile(`expires [0-9a-z]+`)

// ruleset is what the node namespace's egress tables hold, without the
// counters' values and the elements' expiry countdowns.
func (n *testNode) ruleset(t *testing.T) string {
	t.Helper()
	rs := counts.ReplaceAllString(run(t, "ip", "netns", "exec", n.host, "nft", "list", "table", "bridge", Table)+
		run(t, "ip", "netns", "exec", n.host, "nft", "list", "table", "inet", Table), "packets N bytes N")
	return expiries.ReplaceAllString(rs, "expires T")
}

// netlabNamespace is a namespace for a benchmark.
func netlabNamespace(b *testing.B) string {
	b.Helper()
	return netlab.Namespace(b, "kairon-egress-bench")
}
