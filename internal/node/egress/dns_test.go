package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/netlab"
)

const dnsProxyPort = 5353

// upstreamDNS is the outside's resolver: names to IPv4 addresses, each
// answered with ttl.
func upstreamDNS(t *testing.T, ns, addr string, ttl uint32, records map[string]string) {
	t.Helper()
	netlab.ServeDNS(t, ns, addr, ttl, records)
}

// startDNSProxy runs the node's DNS proxy in the node namespace on
// dnsProxyPort, forwarding to upstream from there.
func (n *testNode) startDNSProxy(t *testing.T, upstream string, denied func(Machine, string)) {
	t.Helper()
	var uc net.PacketConn
	var ln net.Listener
	addr := fmt.Sprintf(":%d", dnsProxyPort)
	if err := inNetNS(n.host, func() (err error) {
		if uc, err = net.ListenPacket("udp", addr); err != nil {
			return err
		}
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	proxy := &DNSProxy{
		Enforcer: n.enforcer,
		Upstream: upstream,
		Dial: func(ctx context.Context, network, address string) (c net.Conn, err error) {
			err = inNetNS(n.host, func() error { c, err = (&net.Dialer{}).DialContext(ctx, network, address); return err })
			return c, err
		},
		Denied: denied,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- proxy.Serve(ctx, uc.(*net.UDPConn), ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("DNS proxy: %v", err)
		}
	})
}

// resolve asks server (as the guest would its resolver) for name's A
// records over network, from ns.
func resolve(ns, network, server, name string) (dnsmessage.RCode, []netip.Addr, error) {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 4242, RecursionDesired: true})
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	query, _ := b.Finish()
	var resp []byte
	err := inNetNS(ns, func() error {
		c, err := net.DialTimeout(network, server, 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if network == "udp" {
			if _, err := c.Write(query); err != nil {
				return err
			}
			buf := make([]byte, 4096)
			n, err := c.Read(buf)
			resp = buf[:n]
			return err
		}
		if err := writeTCPMessage(c, query); err != nil {
			return err
		}
		resp, err = readTCPMessage(c)
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	a, err := ParseAnswer(Query{ID: 4242, Name: name, Type: dnsmessage.TypeA}, resp)
	return a.RCode, a.Addrs, err
}

func mustResolve(t *testing.T, g *testGuest, network, server, name, want string) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, g.Name+" resolving "+name+" over "+network+" at "+server, func() (bool, string) {
		rcode, addrs, err := resolve(g.netns, network, server, name)
		return err == nil && rcode == dnsmessage.RCodeSuccess && len(addrs) == 1 && addrs[0].String() == want, fmt.Sprint(rcode, addrs, err)
	})
}

// allowDNSProxy tells the baseline the proxy's port, as the agent does
// with --egress-dns-port: the baseline refuses every other new connection
// from a guest to the node.
func (n *testNode) allowDNSProxy(t *testing.T) {
	n.baseline.ProxyPorts = []uint16{dnsProxyPort, sniProxyPort}
	if err := n.baseline.Setup(); err != nil {
		t.Fatal(err)
	}
}

func TestDNSProxy(t *testing.T) {
	n := newTestNode(t)
	n.enforcer.DNSPort = dnsProxyPort
	// A short TTL floor, so that expiry happens within the test.
	n.enforcer.MinTTL, n.enforcer.Grace = 2*time.Second, time.Second
	if err := n.enforcer.Setup(); err != nil { // again, with the proxy's chain
		t.Fatal(err)
	}
	upstreamDNS(t, n.outside, uplinkOutside+":53", 1, map[string]string{"pkg.test": pkgAddr, "other.test": otherAddr, "a.cdn.test": otherAddr})
	var mu sync.Mutex
	var denied []string
	n.startDNSProxy(t, uplinkOutside+":53", func(m Machine, name string) {
		mu.Lock()
		defer mu.Unlock()
		denied = append(denied, m.Name+" "+name)
	})
	n.allowDNSProxy(t)
	for _, a := range []string{pkgAddr + ":8050", pkgAddr + ":9000", otherAddr + ":8050"} {
		serveTCP(t, n.outside, a)
	}
	policy := mustCompile(t, kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pkg.test", "*.cdn.test"}, AllowPorts: []kaironv1.PortRange{"8050"}})
	vm := n.guest(t, "team-a", "vm", "10.88.1.2")
	late := n.guest(t, "team-a", "late", "10.88.1.3")
	for _, g := range []*testGuest{vm, late} {
		if err := n.enforcer.Apply(g.Machine, policy); err != nil {
			t.Fatal(err)
		}
	}

	// Any resolver address: the query goes to the proxy.
	resolver := "198.51.100.53:53"
	mustResolve(t, vm, "udp", resolver, "pkg.test", pkgAddr)
	mustReach(t, vm, pkgAddr+":8050")
	t.Run("port not allowed", func(t *testing.T) { mustNotReach(t, vm, pkgAddr+":9000") })
	t.Run("another host by IP", func(t *testing.T) { mustNotReach(t, vm, otherAddr+":8050") })
	t.Run("name not allowed", func(t *testing.T) {
		rcode, addrs, err := resolve(vm.netns, "udp", resolver, "other.test")
		if err != nil || rcode != dnsmessage.RCodeRefused || len(addrs) != 0 {
			t.Fatalf("other.test: %v %v %v, want REFUSED", rcode, addrs, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(denied) != 1 || denied[0] != "vm other.test" {
			t.Fatalf("denied queries reported: %v", denied)
		}
	})
	t.Run("hard-coded address without resolving", func(t *testing.T) {
		mustNotReach(t, late, pkgAddr+":8050")
		mustResolve(t, late, "tcp", n.gateway.String()+":53", "pkg.test", pkgAddr)
		mustReach(t, late, pkgAddr+":8050")
	})
	t.Run("wildcard", func(t *testing.T) {
		mustResolve(t, vm, "tcp", resolver, "a.cdn.test", otherAddr)
		mustReach(t, vm, otherAddr+":8050")
	})
	t.Run("learned address expires", func(t *testing.T) {
		set := learnedSetName(vm.Tap, policy.Grants[0].ID())
		testenv.Eventually(t, waitTimeout, "the learned address of pkg.test to expire", func() (bool, string) {
			out := run(t, "ip", "netns", "exec", n.host, "nft", "list", "set", "inet", Table, set)
			return !strings.Contains(out, pkgAddr), out
		})
		mustNotReach(t, vm, pkgAddr+":8050")
		mustResolve(t, vm, "udp", resolver, "pkg.test", pkgAddr)
		mustReach(t, vm, pkgAddr+":8050")
	})
	t.Run("removal leaves no proxy state", func(t *testing.T) {
		for _, g := range []*testGuest{vm, late} {
			if err := n.enforcer.Remove(g.Tap); err != nil {
				t.Fatal(err)
			}
		}
		if rs := n.ruleset(t); strings.Contains(rs, "10.88.1.") || strings.Contains(rs, "kt") {
			t.Fatalf("objects of removed Machines are left:\n%s", rs)
		}
		if _, _, ok := n.enforcer.Lookup(vm.IP); ok {
			t.Fatal("the proxy still knows the removed Machine")
		}
		// Its DNS is its own again: the outside's resolver answers.
		mustResolve(t, vm, "udp", uplinkOutside+":53", "other.test", otherAddr)
	})
	t.Run("unconfined guest is not proxied", func(t *testing.T) {
		free := n.guest(t, "team-b", "free", "10.88.2.2")
		if _, _, err := resolve(free.netns, "udp", uplinkOutside+":53", "other.test"); err != nil {
			t.Fatalf("an unconfined guest resolving at the outside's resolver: %v", err)
		}
	})
}

func TestParseQueryRefusesOddMessages(t *testing.T) {
	build := func(h dnsmessage.Header, qs ...dnsmessage.Question) []byte {
		b := dnsmessage.NewBuilder(nil, h)
		_ = b.StartQuestions()
		for _, q := range qs {
			_ = b.Question(q)
		}
		out, _ := b.Finish()
		return out
	}
	q := dnsmessage.Question{Name: dnsmessage.MustNewName("pkg.test."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}
	if got, err := ParseQuery(build(dnsmessage.Header{ID: 7}, q)); err != nil || got.Name != "pkg.test" || got.ID != 7 {
		t.Fatalf("ParseQuery = %+v, %v", got, err)
	}
	for name, c := range map[string]struct {
		msg   []byte
		rcode dnsmessage.RCode
	}{
		"empty":          {nil, dnsmessage.RCodeFormatError},
		"truncated":      {build(dnsmessage.Header{ID: 7}, q)[:15], dnsmessage.RCodeFormatError},
		"a response":     {build(dnsmessage.Header{ID: 7, Response: true}, q), dnsmessage.RCodeFormatError},
		"two questions":  {build(dnsmessage.Header{ID: 7}, q, q), dnsmessage.RCodeFormatError},
		"no question":    {build(dnsmessage.Header{ID: 7}), dnsmessage.RCodeFormatError},
		"class CHAOS":    {build(dnsmessage.Header{ID: 7}, dnsmessage.Question{Name: q.Name, Type: q.Type, Class: dnsmessage.ClassCHAOS}), dnsmessage.RCodeRefused},
		"not a query op": {build(dnsmessage.Header{ID: 7, OpCode: 5}, q), dnsmessage.RCodeNotImplemented},
	} {
		if _, err := ParseQuery(c.msg); err == nil || rcodeOf(err) != c.rcode {
			t.Errorf("%s: %v, want %v", name, err, c.rcode)
		}
	}
	if _, err := ParseAnswer(Query{ID: 8, Name: "pkg.test", Type: dnsmessage.TypeA}, build(dnsmessage.Header{ID: 7, Response: true}, q)); err == nil {
		t.Error("ParseAnswer accepted a response with another ID")
	}
	if _, err := ParseAnswer(Query{ID: 7, Name: "other.test", Type: dnsmessage.TypeA}, build(dnsmessage.Header{ID: 7, Response: true}, q)); err == nil {
		t.Error("ParseAnswer accepted a response to another question")
	}
}

func TestParseAnswerFollowsOnlyTheChain(t *testing.T) {
	name := dnsmessage.MustNewName("pkg.test.")
	cdn := dnsmessage.MustNewName("edge.cdn.test.")
	stray := dnsmessage.MustNewName("evil.test.")
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 1, Response: true})
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	_ = b.StartAnswers()
	_ = b.CNAMEResource(dnsmessage.ResourceHeader{Name: name, Class: dnsmessage.ClassINET, TTL: 300}, dnsmessage.CNAMEResource{CNAME: cdn})
	_ = b.AResource(dnsmessage.ResourceHeader{Name: cdn, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: [4]byte{203, 0, 113, 10}})
	_ = b.AResource(dnsmessage.ResourceHeader{Name: stray, Class: dnsmessage.ClassINET, TTL: 5}, dnsmessage.AResource{A: [4]byte{203, 0, 113, 66}})
	msg, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	a, err := ParseAnswer(Query{ID: 1, Name: "pkg.test", Type: dnsmessage.TypeA}, msg)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Addrs) != 1 || a.Addrs[0] != netip.MustParseAddr("203.0.113.10") || a.TTL != time.Minute {
		t.Fatalf("ParseAnswer = %+v, want only the chain's 203.0.113.10 with TTL 60s", a)
	}
}
