package egress

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// The DNS proxy's tests against a resolver on loopback that the test
// scripts and that records the raw bytes the proxy sends it: what the
// outside would see of a confined guest's DNS.

var (
	upstreamA    = netip.MustParseAddr("203.0.113.10")
	upstreamAAAA = netip.MustParseAddr("2001:db8::10")
)

// sentQuery is one query as the upstream received it.
type sentQuery struct {
	network string
	raw     []byte
}

// fakeUpstream is a resolver on 127.0.0.1 (UDP and TCP). By default it
// answers a query with its ID and question and one address of the asked
// type (upstreamA or upstreamAAAA) with TTL 60; edit changes that answer.
type fakeUpstream struct {
	udp *net.UDPConn
	tcp net.Listener
	wg  sync.WaitGroup

	mu      sync.Mutex
	queries []sentQuery
	edit    func(m *dnsmessage.Message, network string)
	conns   map[net.Conn]bool
}

func startFakeUpstream(t *testing.T) *fakeUpstream {
	t.Helper()
	uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = uc.Close()
		t.Fatal(err)
	}
	u := &fakeUpstream{udp: uc, tcp: ln, conns: map[net.Conn]bool{}}
	u.wg.Add(2)
	go u.serveUDP()
	go u.serveTCP()
	t.Cleanup(func() {
		_ = uc.Close()
		_ = ln.Close()
		u.mu.Lock()
		for c := range u.conns {
			_ = c.Close()
		}
		u.mu.Unlock()
		u.wg.Wait()
	})
	return u
}

func (u *fakeUpstream) serveUDP() {
	defer u.wg.Done()
	buf := make([]byte, 65535)
	for {
		n, from, err := u.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		if out := u.respond("udp", append([]byte(nil), buf[:n]...)); out != nil {
			_, _ = u.udp.WriteToUDPAddrPort(out, from)
		}
	}
}

func (u *fakeUpstream) serveTCP() {
	defer u.wg.Done()
	for {
		c, err := u.tcp.Accept()
		if err != nil {
			return
		}
		u.mu.Lock()
		u.conns[c] = true
		u.mu.Unlock()
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			defer func() {
				u.mu.Lock()
				delete(u.conns, c)
				u.mu.Unlock()
				_ = c.Close()
			}()
			for {
				msg, err := readTCPMessage(c)
				if err != nil {
					return
				}
				out := u.respond("tcp", msg)
				if out == nil || writeTCPMessage(c, out) != nil {
					return
				}
			}
		}()
	}
}

// respond records query and makes the answer to it.
func (u *fakeUpstream) respond(network string, query []byte) []byte {
	u.mu.Lock()
	u.queries = append(u.queries, sentQuery{network: network, raw: query})
	edit := u.edit
	u.mu.Unlock()
	var m dnsmessage.Message
	if err := m.Unpack(query); err != nil || len(m.Questions) == 0 {
		return nil
	}
	m.Header.Response, m.Header.RecursionAvailable = true, true
	m.Answers, m.Authorities, m.Additionals = nil, nil, nil
	q := m.Questions[0]
	switch q.Type {
	case dnsmessage.TypeA:
		m.Answers = append(m.Answers, aRecord(q.Name.String(), upstreamA, 60))
	case dnsmessage.TypeAAAA:
		m.Answers = append(m.Answers, dnsmessage.Resource{
			Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeAAAA, Class: dnsmessage.ClassINET, TTL: 60},
			Body:   &dnsmessage.AAAAResource{AAAA: upstreamAAAA.As16()},
		})
	}
	if edit != nil {
		edit(&m, network)
	}
	out, err := m.Pack()
	if err != nil {
		return nil
	}
	return out
}

func aRecord(name string, a netip.Addr, ttl uint32) dnsmessage.Resource {
	return dnsmessage.Resource{
		Header: dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: ttl},
		Body:   &dnsmessage.AResource{A: a.As4()},
	}
}

func cnameRecord(name, target string, ttl uint32) dnsmessage.Resource {
	return dnsmessage.Resource{
		Header: dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeCNAME, Class: dnsmessage.ClassINET, TTL: ttl},
		Body:   &dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName(target)},
	}
}

func txtRecord(name, text string) dnsmessage.Resource {
	return dnsmessage.Resource{
		Header: dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeTXT, Class: dnsmessage.ClassINET, TTL: 60},
		Body:   &dnsmessage.TXTResource{TXT: []string{text}},
	}
}

// dial reaches the fake upstream whatever address the proxy was given.
func (u *fakeUpstream) dial(ctx context.Context, network, _ string) (net.Conn, error) {
	addr := u.tcp.Addr().String()
	if network == "udp" {
		addr = u.udp.LocalAddr().String()
	}
	return (&net.Dialer{}).DialContext(ctx, network, addr)
}

// answerWith makes edit change the upstream's answers (nil: the default).
func (u *fakeUpstream) answerWith(edit func(m *dnsmessage.Message, network string)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.edit = edit
}

// take returns the queries received since the last take and forgets them.
func (u *fakeUpstream) take() []sentQuery {
	u.mu.Lock()
	defer u.mu.Unlock()
	q := u.queries
	u.queries = nil
	return q
}

// proxyUnderTest is a DNS proxy for one confined guest, allowed pkg.test
// and *.cdn.test, in front of a fakeUpstream. Queries are handed to
// Handle as the serving loops would.
type proxyUnderTest struct {
	n        *testNode
	guest    *testGuest
	policy   *Policy
	proxy    *DNSProxy
	upstream *fakeUpstream
}

func newProxyUnderTest(t *testing.T) *proxyUnderTest {
	t.Helper()
	n := newTestNode(t)
	up := startFakeUpstream(t)
	policy := mustCompile(t, kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pkg.test", "*.cdn.test"}, AllowPorts: []kaironv1.PortRange{"443"}})
	g := n.guest(t, "team-a", "vm", "10.88.1.2")
	if err := n.enforcer.Apply(g.Machine, policy); err != nil {
		t.Fatal(err)
	}
	return &proxyUnderTest{n: n, guest: g, policy: policy, upstream: up,
		proxy: &DNSProxy{Enforcer: n.enforcer, Upstream: "192.0.2.53:53", Dial: up.dial}}
}

// exchange hands query to the proxy as arriving over network from the
// guest, and returns its reply (unpacked; nil when there is none) and the
// queries the upstream received meanwhile.
func (p *proxyUnderTest) exchange(t *testing.T, network string, query []byte) (*dnsmessage.Message, []sentQuery) {
	t.Helper()
	p.upstream.take()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	raw := p.proxy.Handle(ctx, p.guest.IP, query, network)
	sent := p.upstream.take()
	if raw == nil {
		return nil, sent
	}
	if network == "udp" && len(raw) > 512 && !hasEDNS(query) {
		t.Errorf("a %d-byte UDP reply to a guest that takes 512", len(raw))
	}
	var m dnsmessage.Message
	if err := m.Unpack(raw); err != nil {
		t.Fatalf("the proxy's reply does not parse: %v", err)
	}
	return &m, sent
}

func hasEDNS(query []byte) bool {
	var m dnsmessage.Message
	if m.Unpack(query) != nil {
		return false
	}
	for _, r := range m.Additionals {
		if r.Header.Type == dnsmessage.TypeOPT {
			return true
		}
	}
	return false
}

// learned tells whether the guest's grant holds addr, learned from DNS.
func (p *proxyUnderTest) learned(t *testing.T, addr netip.Addr) bool {
	t.Helper()
	out := run(t, "ip", "netns", "exec", p.n.host, "nft", "list", "set", "inet", Table, learnedSetName(p.guest.Tap, p.policy.Grants[0].ID()))
	return strings.Contains(out, addr.String()+" ")
}

// buildQuery is a guest's query: h, the questions qs, and what extra
// adds after them (it starts the sections it writes).
func buildQuery(t testing.TB, h dnsmessage.Header, qs []dnsmessage.Question, extra func(b *dnsmessage.Builder) error) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, h)
	if err := b.StartQuestions(); err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if err := b.Question(q); err != nil {
			t.Fatal(err)
		}
	}
	if extra != nil {
		if err := extra(&b); err != nil {
			t.Fatal(err)
		}
	}
	out, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func question(name string, typ dnsmessage.Type) dnsmessage.Question {
	return dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}
}

// plainQuery is what glibc sends: RD, one question, nothing else.
func plainQuery(t testing.TB, id uint16, name string, typ dnsmessage.Type) []byte {
	return buildQuery(t, dnsmessage.Header{ID: id, RecursionDesired: true}, []dnsmessage.Question{question(name, typ)}, nil)
}

// answerStrings are m's answer records as "name type value ttl".
func answerStrings(m *dnsmessage.Message) []string {
	var out []string
	for _, r := range m.Answers {
		var v string
		switch b := r.Body.(type) {
		case *dnsmessage.AResource:
			v = netip.AddrFrom4(b.A).String()
		case *dnsmessage.AAAAResource:
			v = netip.AddrFrom16(b.AAAA).String()
		case *dnsmessage.CNAMEResource:
			v = b.CNAME.String()
		default:
			v = b.GoString()
		}
		out = append(out, r.Header.Name.String()+" "+r.Header.Type.String()+" "+v+" "+strconv.FormatUint(uint64(r.Header.TTL), 10))
	}
	return out
}
