package netlab

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"github.com/zyvor/kairon/internal/testenv/host"
)

// Namespace creates a network namespace named prefix-<random> with its
// loopback up, removed when the test ends.
func Namespace(t testing.TB, prefix string) string {
	t.Helper()
	host.SkipIfShort(t, "root, to make network namespaces")
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := prefix + "-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s (network tests need root and iproute2)", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	Run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return name
}

// Run runs a command and fails the test on an error; it returns the
// output.
func Run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// In runs fn on a thread in namespace ns. Sockets made there stay in ns.
// The thread goes back to its own namespace afterwards and lives on: a
// thread that ended would take with it (Pdeathsig follows the thread that
// forked a child) any process the test had started from it, such as a
// kairon-node. Only if it cannot go back is it left locked, so that Go
// discards it rather than run other code in ns.
func In(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		own, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer own.Close()
		f, err := os.Open("/var/run/netns/" + ns)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		err = fn()
		if unix.Setns(int(own.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// Outside links namespace inner to a new namespace, the outside, through a
// veth pair on 198.51.100.0/24 (inner .1, outside .2), puts addrs on the
// outside's loopback and routes them from inner; the outside routes back
// the networks in back. It returns the outside's name.
func Outside(t testing.TB, inner string, addrs []string, back ...string) string {
	t.Helper()
	out := Namespace(t, "kairon-outside")
	veth := "kx" + hex.EncodeToString([]byte(out[len(out)-4:]))
	Run(t, "ip", "-n", inner, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", out)
	Run(t, "ip", "-n", inner, "addr", "add", "198.51.100.1/24", "dev", veth)
	Run(t, "ip", "-n", inner, "link", "set", veth, "up")
	Run(t, "ip", "-n", out, "addr", "add", "198.51.100.2/24", "dev", "eth0")
	Run(t, "ip", "-n", out, "link", "set", "eth0", "up")
	for _, a := range addrs {
		Run(t, "ip", "-n", out, "addr", "add", a+"/32", "dev", "lo")
		Run(t, "ip", "-n", inner, "route", "add", a+"/32", "via", "198.51.100.2")
	}
	for _, n := range back {
		Run(t, "ip", "-n", out, "route", "add", n, "via", "198.51.100.1")
	}
	return out
}

func listen(t testing.TB, ns, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := In(ns, func() (err error) { ln, err = net.Listen(network, addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// ServeGreeting listens on addr in ns and answers every TCP connection with
// greeting, then closes it.
func ServeGreeting(t testing.TB, ns, addr, greeting string) {
	t.Helper()
	ln := listen(t, ns, "tcp", addr)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(greeting))
			_ = c.Close()
		}
	}()
}

// Certificate is a self-signed certificate for names.
func Certificate(t testing.TB, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]},
		DNSNames: names, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// ServeTLS listens on addr in ns and answers every TLS connection with
// greeting, whatever server name it asks for.
func ServeTLS(t testing.TB, ns, addr, greeting string, names ...string) {
	t.Helper()
	cfg := &tls.Config{Certificates: []tls.Certificate{Certificate(t, names...)}}
	ln := listen(t, ns, "tcp", addr)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := tls.Server(c, cfg)
				_ = tc.SetDeadline(time.Now().Add(time.Minute))
				if tc.Handshake() == nil {
					_, _ = tc.Write([]byte(greeting))
					_ = tc.Close()
				}
			}()
		}
	}()
}

// ServeHTTP listens on addr in ns and answers every request with body;
// with names, over TLS with a certificate for them.
func ServeHTTP(t testing.TB, ns, addr, body string, names ...string) {
	t.Helper()
	ln := listen(t, ns, "tcp", addr)
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, body) }),
		ReadHeaderTimeout: time.Minute,
	}
	t.Cleanup(func() { _ = srv.Close() })
	if len(names) > 0 {
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{Certificate(t, names...)}}
		go func() { _ = srv.ServeTLS(ln, "", "") }()
		return
	}
	go func() { _ = srv.Serve(ln) }()
}

// ServeDNS is a resolver on addr (UDP and TCP) in ns answering A queries
// for records (name → IPv4 address) with ttl, and nothing else.
func ServeDNS(t testing.TB, ns, addr string, ttl uint32, records map[string]string) {
	t.Helper()
	answer := func(msg []byte) []byte {
		var p dnsmessage.Parser
		h, err := p.Start(msg)
		if err != nil {
			return nil
		}
		q, err := p.Question()
		if err != nil {
			return nil
		}
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true})
		_ = b.StartQuestions()
		_ = b.Question(q)
		_ = b.StartAnswers()
		name := strings.ToLower(strings.TrimSuffix(q.Name.String(), "."))
		if ip, ok := records[name]; ok && q.Type == dnsmessage.TypeA {
			_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: ttl}, dnsmessage.AResource{A: netip.MustParseAddr(ip).As4()})
		}
		out, _ := b.Finish()
		return out
	}
	var uc net.PacketConn
	if err := In(ns, func() (err error) { uc, err = net.ListenPacket("udp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = uc.Close() })
	ln := listen(t, ns, "tcp", addr)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := uc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out := answer(buf[:n]); out != nil {
				_, _ = uc.WriteTo(out, from)
			}
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(time.Minute))
				var n uint16
				if binary.Read(c, binary.BigEndian, &n) != nil {
					return
				}
				msg := make([]byte, n)
				if _, err := io.ReadFull(c, msg); err != nil {
					return
				}
				out := answer(msg)
				_ = binary.Write(c, binary.BigEndian, uint16(len(out)))
				_, _ = c.Write(out)
			}()
		}
	}()
}

// DialGreeting connects from ns to the TCP address addr and reads what a
// ServeGreeting of greeting sends, within timeout.
func DialGreeting(ns, addr, greeting string, timeout time.Duration) error {
	return In(ns, func() error {
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		buf := make([]byte, len(greeting))
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if string(buf) != greeting {
			return fmt.Errorf("greeting %q, want %q", buf, greeting)
		}
		return nil
	})
}
