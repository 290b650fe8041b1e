package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// maxDNSMessage bounds what the proxy reads from a guest or the upstream:
// the largest message TCP can frame. A UDP query above 4096 bytes (EDNS's
// usual ceiling) is not a query a resolver sends.
const (
	maxUDPQuery   = 4096
	maxDNSMessage = 65535
	// upstreamTimeout bounds one query to the upstream; the guest's resolver
	// retries on its own.
	upstreamTimeout = 3 * time.Second
	// tcpIdle closes a guest's TCP DNS connection that sends nothing.
	tcpIdle = 10 * time.Second
	// maxInFlight bounds the queries being answered at once, and
	// maxTCPConns the guests' open TCP connections: a guest flooding its
	// resolver gets its excess dropped instead of the agent's memory.
	maxInFlight = 256
	maxTCPConns = 128
	// maxLearned bounds the addresses one answer may teach.
	maxLearned = 64
)

// DNSProxy answers the DNS of confined guests, which the enforcer's nat
// chain redirects to it whatever resolver they asked. A name their policy
// does not allow gets REFUSED; for an allowed one the proxy asks Upstream
// a query of its own (never the guest's bytes: dns_query.go), and the
// addresses of the validated answer are installed for the guest before an
// answer rebuilt from it goes back (dns_answer.go).
type DNSProxy struct {
	Enforcer *Enforcer
	// Upstream is the node's resolver, host:port.
	Upstream string
	// Dial reaches the upstream (tests dial from a network namespace);
	// nil: a net.Dialer.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// Denied is told about every refused query, for metrics and events.
	Denied func(m Machine, name string)

	once     sync.Once
	inFlight chan struct{}
	tcpConns chan struct{}
}

func (d *DNSProxy) init() {
	d.once.Do(func() {
		d.inFlight = make(chan struct{}, maxInFlight)
		d.tcpConns = make(chan struct{}, maxTCPConns)
	})
}

// Handle answers one query from the guest at from. It never forwards the
// guest's bytes (see dns_query.go) and never returns an answer whose
// addresses are not installed.
func (d *DNSProxy) Handle(ctx context.Context, from netip.Addr, msg []byte, network string) []byte {
	m, policy, ok := d.Enforcer.Lookup(from)
	if !ok {
		var id uint16
		if len(msg) >= 2 {
			id = binary.BigEndian.Uint16(msg)
		}
		return refusal(&Query{ID: id}, dnsmessage.RCodeRefused)
	}
	q, err := ParseQuery(msg)
	if err != nil {
		return refusal(&q, rcodeOf(err))
	}
	if !hostName(q.Name) || !policy.AllowsQuery(q.Name) {
		if d.Denied != nil {
			d.Denied(m, q.Name)
		}
		return refusal(&q, dnsmessage.RCodeRefused)
	}
	if !forwardedType(q.Type) {
		return refusal(&q, dnsmessage.RCodeSuccess) // no data
	}
	ask := Query{ID: newQueryID(), Name: q.Name, Type: q.Type}
	query, err := upstreamQuery(ask)
	if err != nil {
		return refusal(&q, dnsmessage.RCodeServerFailure)
	}
	resp, err := d.forward(ctx, network, query)
	if err != nil {
		return refusal(&q, dnsmessage.RCodeServerFailure)
	}
	a, err := ParseAnswer(ask, resp)
	if err != nil {
		return refusal(&q, dnsmessage.RCodeServerFailure)
	}
	if a.Truncated {
		// Over UDP: the guest asks again over TCP, and so does the proxy.
		return truncatedReply(&q, dnsmessage.RCodeSuccess)
	}
	if a.RCode != dnsmessage.RCodeSuccess && a.RCode != dnsmessage.RCodeNameError {
		return refusal(&q, dnsmessage.RCodeServerFailure)
	}
	if len(a.Addrs) > maxLearned {
		return refusal(&q, dnsmessage.RCodeServerFailure)
	}
	if len(a.Addrs) > 0 {
		if err := d.Enforcer.Learn(from, q.Name, a.Addrs, a.TTL); err != nil {
			return refusal(&q, dnsmessage.RCodeServerFailure)
		}
	}
	limit := maxDNSMessage
	if network == "udp" {
		limit = q.UDPSize
	}
	return reply(&q, a.RCode, a.Records, d.Enforcer.MaxTTL, limit)
}

func (d *DNSProxy) forward(ctx context.Context, network string, msg []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, upstreamTimeout)
	defer cancel()
	dial := d.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	c, err := dial(ctx, network, d.Upstream)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	if network == "udp" {
		if _, err := c.Write(msg); err != nil {
			return nil, err
		}
		buf := make([]byte, maxUDPQuery)
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
	if err := writeTCPMessage(c, msg); err != nil {
		return nil, err
	}
	return readTCPMessage(c)
}

func writeTCPMessage(w io.Writer, msg []byte) error {
	if len(msg) > maxDNSMessage {
		return errors.New("message too long")
	}
	buf := make([]byte, 2+len(msg))
	binary.BigEndian.PutUint16(buf, uint16(len(msg)))
	copy(buf[2:], msg)
	_, err := w.Write(buf)
	return err
}

func readTCPMessage(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	return msg, nil
}

// ServeUDP answers the queries arriving on c until it is closed.
func (d *DNSProxy) ServeUDP(ctx context.Context, c *net.UDPConn) error {
	d.init()
	buf := make([]byte, maxUDPQuery+1)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		if n > maxUDPQuery {
			continue
		}
		msg := append([]byte(nil), buf[:n]...)
		select {
		case d.inFlight <- struct{}{}:
		default:
			continue // the guest's resolver retries
		}
		go func() {
			defer func() { <-d.inFlight }()
			if resp := d.Handle(ctx, from.Addr().Unmap(), msg, "udp"); resp != nil {
				_, _ = c.WriteToUDPAddrPort(resp, from)
			}
		}()
	}
}

// ServeTCP answers the queries of the connections ln accepts until it is
// closed.
func (d *DNSProxy) ServeTCP(ctx context.Context, ln net.Listener) error {
	d.init()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		select {
		case d.tcpConns <- struct{}{}:
		default:
			_ = c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-d.tcpConns }()
			defer c.Close()
			from, err := netip.ParseAddrPort(c.RemoteAddr().String())
			if err != nil {
				return
			}
			for {
				_ = c.SetDeadline(time.Now().Add(tcpIdle))
				msg, err := readTCPMessage(c)
				if err != nil {
					return
				}
				resp := d.Handle(ctx, from.Addr().Unmap(), msg, "tcp")
				if resp == nil || writeTCPMessage(c, resp) != nil {
					return
				}
			}
		}()
	}
}

// ListenAndServe serves DNS on addr over UDP and TCP until ctx ends.
func (d *DNSProxy) ListenAndServe(ctx context.Context, addr string) error {
	uc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("egress: DNS proxy: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		_ = uc.Close()
		return fmt.Errorf("egress: DNS proxy: %w", err)
	}
	return d.Serve(ctx, uc.(*net.UDPConn), ln)
}

// Serve serves DNS on c and ln until ctx ends, then closes them.
func (d *DNSProxy) Serve(ctx context.Context, c *net.UDPConn, ln net.Listener) error {
	errc := make(chan error, 2)
	go func() { errc <- d.ServeUDP(ctx, c) }()
	go func() { errc <- d.ServeTCP(ctx, ln) }()
	<-ctx.Done()
	_ = c.Close()
	_ = ln.Close()
	return errors.Join(<-errc, <-errc)
}
