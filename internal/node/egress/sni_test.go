package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/netlab"
)

const sniProxyPort = 5354

// serveTLS listens on addr in ns and answers every TLS connection with
// "hi", whatever server name it asks for.
func serveTLS(t *testing.T, ns, addr string) {
	t.Helper()
	netlab.ServeTLS(t, ns, addr, "hi", "pkg.test", "*.pkg.test")
}

// dialTLS opens a TLS connection from ns to addr naming serverName and
// reads the server's greeting.
func dialTLS(ns, addr, serverName string) error {
	return inNetNS(ns, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(blockedWindow))
		tc := tls.Client(c, &tls.Config{ServerName: serverName, InsecureSkipVerify: true})
		buf := make([]byte, 2)
		if _, err := io.ReadFull(tc, buf); err != nil {
			return err
		}
		if string(buf) != "hi" {
			return fmt.Errorf("greeting %q", buf)
		}
		return nil
	})
}

// sendPlain opens a TCP connection from ns to addr, sends an HTTP request
// and reads the answer.
func sendPlain(ns, addr string) error {
	return inNetNS(ns, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(blockedWindow))
		if _, err := c.Write([]byte("GET / HTTP/1.0\r\nHost: pkg.test\r\n\r\n")); err != nil {
			return err
		}
		_, err = io.ReadAll(c)
		return err
	})
}

func mustTLS(t *testing.T, g *testGuest, addr, serverName string) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, g.Name+" completing TLS with "+addr+" as "+serverName, func() (bool, string) {
		err := dialTLS(g.netns, addr, serverName)
		return err == nil, fmt.Sprint(err)
	})
}

// mustBeReset checks that err is a connection reset: the proxy refused,
// rather than the connection timing out or the server answering.
func mustBeReset(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("%s: %v, want the connection reset", what, err)
	}
}

func (n *testNode) startSNIProxy(t *testing.T, denied func(Machine, netip.AddrPort, string)) {
	t.Helper()
	ln, err := ListenTCP(n.host, fmt.Sprintf(":%d", sniProxyPort))
	if err != nil {
		t.Fatal(err)
	}
	proxy := &SNIProxy{Enforcer: n.enforcer, Dial: DialIn(n.host), Denied: denied}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- proxy.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("SNI proxy: %v", err)
		}
	})
}

// TestSNIProxy sends real TLS and plain TCP from veth guests whose grants
// set allowSNI, through the node's SNI proxy, to servers in the outside
// namespace.
func TestSNIProxy(t *testing.T) {
	n := newTestNode(t)
	n.enforcer.DNSPort, n.enforcer.SNIPort = dnsProxyPort, sniProxyPort
	if err := n.enforcer.Setup(); err != nil {
		t.Fatal(err)
	}
	upstreamDNS(t, n.outside, uplinkOutside+":53", 300, map[string]string{"pkg.test": pkgAddr})
	n.startDNSProxy(t, uplinkOutside+":53", nil)
	var mu sync.Mutex
	var denied []string
	n.startSNIProxy(t, func(m Machine, dst netip.AddrPort, name string) {
		mu.Lock()
		defer mu.Unlock()
		denied = append(denied, fmt.Sprintf("%s %s %q", m.Name, dst, name))
	})
	n.allowDNSProxy(t)
	serveTLS(t, n.outside, pkgAddr+":443")
	serveTLS(t, n.outside, otherAddr+":443")
	serveTCP(t, n.outside, otherAddr+":8050")

	byCIDR := n.guest(t, "team-a", "by-cidr", "10.88.1.2")
	byName := n.guest(t, "team-a", "by-name", "10.88.1.3")
	// Two grants: pkgAddr on 443 only with a ClientHello naming a host
	// under pkg.test; otherAddr on 8050 with no name check (union: the
	// first grant's check is not the second's).
	if err := n.enforcer.Apply(byCIDR.Machine, mustCompile(t,
		kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{pkgAddr + "/32"}, AllowPorts: []kaironv1.PortRange{"443"}, AllowSNI: []kaironv1.ServerName{"*.pkg.test"}},
		kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{otherAddr + "/32"}, AllowPorts: []kaironv1.PortRange{"8050"}},
	)); err != nil {
		t.Fatal(err)
	}
	if err := n.enforcer.Apply(byName.Machine, mustCompile(t,
		kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pkg.test"}, AllowPorts: []kaironv1.PortRange{"443"}, AllowSNI: []kaironv1.ServerName{"pkg.test"}},
	)); err != nil {
		t.Fatal(err)
	}

	mustTLS(t, byCIDR, pkgAddr+":443", "api.pkg.test")
	t.Run("wrong server name is reset", func(t *testing.T) {
		mustBeReset(t, "TLS naming evil.test", dialTLS(byCIDR.netns, pkgAddr+":443", "evil.test"))
		mustBeReset(t, "TLS naming pkg.test itself (the wildcard is strictly below)", dialTLS(byCIDR.netns, pkgAddr+":443", "pkg.test"))
	})
	t.Run("plain HTTP is reset", func(t *testing.T) {
		mustBeReset(t, "HTTP to an allowSNI port", sendPlain(byCIDR.netns, pkgAddr+":443"))
	})
	t.Run("the name is no way in by itself", func(t *testing.T) {
		// A name the server would answer to, at an address no grant allows.
		mustNotReach(t, byCIDR, otherAddr+":443")
		if err := dialTLS(byCIDR.netns, otherAddr+":443", "api.pkg.test"); err == nil {
			t.Fatal("a matching server name opened an address no grant allows")
		}
	})
	t.Run("another grant without a name check", func(t *testing.T) {
		mustReach(t, byCIDR, otherAddr+":8050")
	})
	t.Run("learned addresses with a name check", func(t *testing.T) {
		if err := dialTLS(byName.netns, pkgAddr+":443", "pkg.test"); err == nil {
			t.Fatal("reached pkg.test's address before resolving it")
		}
		mustResolve(t, byName, "udp", n.gateway.String()+":53", "pkg.test", pkgAddr)
		mustTLS(t, byName, pkgAddr+":443", "pkg.test")
		mustBeReset(t, "TLS naming api.pkg.test (no wildcard in this grant)", dialTLS(byName.netns, pkgAddr+":443", "api.pkg.test"))
	})
	t.Run("resets are reported with the name", func(t *testing.T) {
		mu.Lock()
		defer mu.Unlock()
		want := []string{
			`by-cidr ` + pkgAddr + `:443 "evil.test"`,
			`by-cidr ` + pkgAddr + `:443 "pkg.test"`,
			`by-cidr ` + pkgAddr + `:443 ""`,
			`by-name ` + pkgAddr + `:443 "api.pkg.test"`,
		}
		if strings.Join(denied, "\n") != strings.Join(want, "\n") {
			t.Fatalf("reported resets:\n%s\nwant:\n%s", strings.Join(denied, "\n"), strings.Join(want, "\n"))
		}
	})
	t.Run("a grant with a name check replaced", func(t *testing.T) {
		// Its learned set goes while the old nat and filter rules that
		// use it are rewritten, in one transaction.
		plain := mustCompile(t, kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pkg.test"}, AllowPorts: []kaironv1.PortRange{"443"}})
		if err := n.enforcer.Apply(byName.Machine, plain); err != nil {
			t.Fatal(err)
		}
		if rs := n.ruleset(t); strings.Contains(rs, "s_"+byName.Tap+" {\n\t\tip daddr") || strings.Count(rs, "set l4_"+byName.Tap) != 1 {
			t.Fatalf("the old grant's rules or set are left:\n%s", rs)
		}
		mustResolve(t, byName, "udp", n.gateway.String()+":53", "pkg.test", pkgAddr)
		mustTLS(t, byName, pkgAddr+":443", "anything.test")
	})
	t.Run("removal leaves no proxy state", func(t *testing.T) {
		for _, g := range []*testGuest{byCIDR, byName} {
			if err := n.enforcer.Remove(g.Tap); err != nil {
				t.Fatal(err)
			}
		}
		if rs := n.ruleset(t); strings.Contains(rs, "10.88.1.") || strings.Contains(rs, "s_kt") {
			t.Fatalf("objects of removed Machines are left:\n%s", rs)
		}
		// Unconfined again: the server answers whatever name is asked.
		mustTLS(t, byCIDR, pkgAddr+":443", "evil.test")
	})
}

func TestReadServerName(t *testing.T) {
	var hello bytes.Buffer
	_ = tls.Client(&recordConn{w: &hello}, &tls.Config{ServerName: "API.pkg.test", InsecureSkipVerify: true}).Handshake()
	in := append(hello.Bytes(), "after"...)
	name, read, err := ReadServerName(bytes.NewReader(in))
	if err != nil || name != "api.pkg.test" {
		t.Fatalf("ReadServerName: %q, %v; want api.pkg.test", name, err)
	}
	// Everything read goes to the server first: it must be the start of
	// the stream, the whole ClientHello at least.
	if !bytes.HasPrefix(in, read) || len(read) < hello.Len() {
		t.Fatalf("the bytes read (%d) are not the start of the stream with the ClientHello (%d)", len(read), hello.Len())
	}
	for _, c := range []struct{ name, in string }{
		{"empty", ""},
		{"HTTP", "GET / HTTP/1.1\r\nHost: pkg.test\r\n\r\n"},
		{"truncated", string(hello.Bytes()[:hello.Len()/2])},
		{"huge record", "\x16\x03\x01\xff\xff" + strings.Repeat("A", 70000)},
	} {
		if name, read, err := ReadServerName(strings.NewReader(c.in)); err == nil {
			t.Errorf("%s: server name %q, want an error", c.name, name)
		} else if len(read) > maxClientHello {
			t.Errorf("%s: read %d bytes, more than %d", c.name, len(read), maxClientHello)
		}
	}
}

func FuzzReadServerName(f *testing.F) {
	var hello bytes.Buffer
	_ = tls.Client(&recordConn{w: &hello}, &tls.Config{ServerName: "pkg.test", InsecureSkipVerify: true}).Handshake()
	f.Add(hello.Bytes())
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte("\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00"))
	f.Fuzz(func(t *testing.T, in []byte) {
		name, read, err := ReadServerName(bytes.NewReader(in))
		if len(read) > maxClientHello {
			t.Fatalf("read %d bytes", len(read))
		}
		if err == nil && name != canonicalName(name) {
			t.Fatalf("name %q not canonical", name)
		}
	})
}

// recordConn captures what a TLS client writes (its ClientHello) and
// gives it nothing to read.
type recordConn struct {
	net.Conn
	w io.Writer
}

func (c *recordConn) Write(b []byte) (int, error)      { return c.w.Write(b) }
func (c *recordConn) Read([]byte) (int, error)         { return 0, io.EOF }
func (c *recordConn) Close() error                     { return nil }
func (c *recordConn) SetDeadline(time.Time) error      { return nil }
func (c *recordConn) SetReadDeadline(time.Time) error  { return nil }
func (c *recordConn) SetWriteDeadline(time.Time) error { return nil }
