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
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// maxClientHello bounds what the proxy reads before it knows the
	// server name: a ClientHello with a post-quantum key share is under
	// 2 KiB, and one TLS record holds at most 16 KiB.
	maxClientHello = 32 << 10
	// helloTimeout closes a connection whose ClientHello does not arrive.
	helloTimeout = 10 * time.Second
	// dialTimeout bounds the connection to the original destination.
	dialTimeout = 10 * time.Second
	// maxSNIConns bounds the connections the proxy holds at once, all
	// guests together: a guest opening connections without end gets the
	// excess reset, not the agent's memory.
	maxSNIConns = 1024
)

// SNIProxy checks the TLS server name of the TCP connections a confined
// guest opens to destinations whose grant sets allowSNI. The enforcer's nat
// chain redirects those connections to it; it reads the ClientHello, and
// when the name matches, connects to the original destination and copies
// both ways. Anything else (another name, no name, not TLS, nothing within
// helloTimeout) is reset.
type SNIProxy struct {
	Enforcer *Enforcer
	// Dial reaches the original destination from the bridge's namespace;
	// nil: a net.Dialer in the caller's.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// Denied is told about every connection reset for its server name
	// (empty when the guest sent none, or no TLS at all).
	Denied func(m Machine, destination netip.AddrPort, serverName string)

	once  sync.Once
	conns chan struct{}
	wg    sync.WaitGroup
}

// Serve accepts the redirected connections on ln until ctx ends, then
// closes ln and every connection it holds.
func (s *SNIProxy) Serve(ctx context.Context, ln net.Listener) error {
	s.once.Do(func() { s.conns = make(chan struct{}, maxSNIConns) })
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		_ = ln.Close()
	}()
	defer s.wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("egress: SNI proxy: %w", err)
		}
		select {
		case s.conns <- struct{}{}:
		default:
			reset(c)
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.conns }()
			s.handle(ctx, c)
		}()
	}
}

// reset closes c with a TCP RST, so that the guest's client sees the
// refusal at once instead of an orderly end of stream.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func (s *SNIProxy) handle(ctx context.Context, c net.Conn) {
	from, ok := netip.AddrFromSlice(c.RemoteAddr().(*net.TCPAddr).IP)
	if !ok {
		reset(c)
		return
	}
	m, p, ok := s.Enforcer.Lookup(from.Unmap())
	if !ok {
		reset(c)
		return
	}
	dst, err := originalDestination(c)
	if err != nil {
		reset(c)
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(helloTimeout))
	name, hello, err := ReadServerName(c)
	if err != nil {
		name = ""
	}
	names := s.Enforcer.serverNamesFor(m, p, dst)
	if name == "" || !matchesAny(names, name) {
		if s.Denied != nil {
			s.Denied(m, dst, name)
		}
		reset(c)
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	dial := s.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	up, err := dial(dctx, "tcp", dst.String())
	cancel()
	if err != nil {
		reset(c)
		return
	}
	if _, err := up.Write(hello); err != nil {
		reset(c)
		_ = up.Close()
		return
	}
	splice(ctx, c, up)
}

// splice copies both ways until both directions end (or ctx does),
// passing half-closes on.
func splice(ctx context.Context, guest, up net.Conn) {
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			_ = guest.Close()
			_ = up.Close()
		case <-done:
		}
	}()
	var wg sync.WaitGroup
	half := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}
	wg.Add(2)
	go half(up, guest)
	go half(guest, up)
	wg.Wait()
	close(done)
	_ = guest.Close()
	_ = up.Close()
}

func matchesAny(patterns []Pattern, name string) bool {
	for _, p := range patterns {
		if p.Match(name) {
			return true
		}
	}
	return false
}

// errHelloRead stops the TLS handshake once the ClientHello is parsed.
var errHelloRead = errors.New("client hello read")

// ReadServerName reads a TLS ClientHello from r, at most maxClientHello
// bytes, and returns its server name and the bytes read, which the
// connection to the server must start with. crypto/tls parses the hello:
// the guest's bytes meet a parser fuzzed and hardened upstream rather than
// one of ours.
func ReadServerName(r io.Reader) (string, []byte, error) {
	var read bytes.Buffer
	var name string
	var seen bool
	conn := &helloConn{r: io.TeeReader(io.LimitReader(r, maxClientHello), &read)}
	err := tls.Server(conn, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			name, seen = h.ServerName, true
			return nil, errHelloRead
		},
	}).Handshake()
	if !seen {
		if err == nil {
			err = errors.New("no ClientHello")
		}
		return "", read.Bytes(), fmt.Errorf("not a TLS ClientHello: %w", err)
	}
	return canonicalName(name), read.Bytes(), nil
}

// helloConn is the read side of a connection for crypto/tls to parse a
// ClientHello from; it writes nothing back (no alert reaches the guest).
type helloConn struct {
	r io.Reader
}

func (c *helloConn) Read(b []byte) (int, error)       { return c.r.Read(b) }
func (c *helloConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *helloConn) Close() error                     { return nil }
func (c *helloConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *helloConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *helloConn) SetDeadline(time.Time) error      { return nil }
func (c *helloConn) SetReadDeadline(time.Time) error  { return nil }
func (c *helloConn) SetWriteDeadline(time.Time) error { return nil }

// originalDestination is where the guest sent the connection before the
// nat chain redirected it here (SO_ORIGINAL_DST, from conntrack).
func originalDestination(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errors.New("not a TCP connection")
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var dst netip.AddrPort
	var sockErr error
	err = raw.Control(func(fd uintptr) {
		// struct sockaddr_in arrives in the bytes of an ipv6_mreq, the
		// getsockopt wrapper of x/sys with a 20-byte result.
		mreq, err := unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			sockErr = err
			return
		}
		b := mreq.Multiaddr
		port := uint16(b[2])<<8 | uint16(b[3])
		dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), port)
	})
	if err == nil {
		err = sockErr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", err)
	}
	return dst, nil
}
