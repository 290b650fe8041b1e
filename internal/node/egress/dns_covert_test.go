package egress

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// assertCleanQuery fails unless raw, as the upstream received it, is a
// query a resolver of the proxy's own would send about name and typ: the
// flags word RD alone (no other flag, opcode, Z bit or rcode), exactly
// one question (name byte for byte, class IN), no answer or authority
// records, and at most an OPT record without options, extended rcode,
// version or DNSSEC OK bit.
func assertCleanQuery(t *testing.T, raw []byte, name string, typ dnsmessage.Type) {
	t.Helper()
	if len(raw) < 12 {
		t.Fatalf("upstream received %d bytes", len(raw))
	}
	if flags := binary.BigEndian.Uint16(raw[2:]); flags != 0x0100 {
		t.Errorf("upstream received flags %#04x, want %#04x (RD alone)", flags, 0x0100)
	}
	counts := [4]uint16{}
	for i := range counts {
		counts[i] = binary.BigEndian.Uint16(raw[4+2*i:])
	}
	if counts[0] != 1 || counts[1] != 0 || counts[2] != 0 || counts[3] > 1 {
		t.Errorf("upstream received sections of %v records, want [1 0 0 0|1]", counts)
	}
	var m dnsmessage.Message
	if err := m.Unpack(raw); err != nil {
		t.Fatalf("upstream received a query that does not parse: %v", err)
	}
	if len(m.Questions) == 1 {
		if q := m.Questions[0]; q.Name.String() != name || q.Type != typ || q.Class != dnsmessage.ClassINET {
			t.Errorf("upstream was asked %v %v %v, want %s %v ClassINET", q.Name, q.Type, q.Class, name, typ)
		}
	}
	for _, r := range m.Additionals {
		opt, ok := r.Body.(*dnsmessage.OPTResource)
		if !ok || r.Header.Name.String() != "." {
			t.Errorf("upstream received an additional record %v %v", r.Header.Name, r.Header.Type)
			continue
		}
		if r.Header.TTL != 0 || len(opt.Options) != 0 {
			t.Errorf("upstream received an OPT record with flags/version %#08x and options %v", r.Header.TTL, opt.Options)
		}
	}
}

// TestDNSProxyForwardsNoCovertChannel: whatever a confined guest varies
// in a query about an allowed name, the upstream receives the same query
// as for the plain question (the ID aside, which is the proxy's own), or
// nothing at all.
func TestDNSProxyForwardsNoCovertChannel(t *testing.T) {
	p := newProxyUnderTest(t)
	networks := []string{"udp", "tcp"}
	// plain is what the upstream receives, ID aside, when the guest asks
	// "pkg.test A" as glibc does; by network.
	plain := map[string][]byte{}
	for _, network := range networks {
		reply, sent := p.exchange(t, network, plainQuery(t, 1, "pkg.test.", dnsmessage.TypeA))
		if len(sent) != 1 {
			t.Fatalf("a plain query over %s: the upstream received %d queries, want 1", network, len(sent))
		}
		assertCleanQuery(t, sent[0].raw, "pkg.test.", dnsmessage.TypeA)
		plain[network] = sent[0].raw[2:]
		if reply == nil || reply.Header.RCode != dnsmessage.RCodeSuccess || !slices.Equal(answerStrings(reply), []string{"pkg.test. TypeA 203.0.113.10 60"}) {
			t.Fatalf("a plain query over %s: reply %+v", network, reply)
		}
	}
	asPlain := func(t *testing.T, network string, sent []sentQuery) {
		t.Helper()
		if len(sent) != 1 {
			t.Fatalf("the upstream received %d queries, want 1", len(sent))
		}
		if got := sent[0].raw[2:]; !bytes.Equal(got, plain[network]) {
			t.Errorf("the upstream received (ID aside)\n%x\nwant the plain query's\n%x", got, plain[network])
			assertCleanQuery(t, sent[0].raw, "pkg.test.", dnsmessage.TypeA)
		}
	}
	answered := func(t *testing.T, reply *dnsmessage.Message, id uint16) {
		t.Helper()
		if reply == nil || reply.Header.ID != id || reply.Header.RCode != dnsmessage.RCodeSuccess ||
			!slices.Equal(answerStrings(reply), []string{"pkg.test. TypeA 203.0.113.10 60"}) {
			t.Errorf("reply %+v, want ID %d and pkg.test's address", reply, id)
		}
	}

	t.Run("arbitrary type", func(t *testing.T) {
		for _, network := range networks {
			for _, typ := range []dnsmessage.Type{43981, dnsmessage.TypeTXT, dnsmessage.TypeMX, dnsmessage.TypePTR, dnsmessage.TypeSRV,
				dnsmessage.TypeCNAME, dnsmessage.TypeNS, dnsmessage.TypeSOA, dnsmessage.TypeHTTPS, dnsmessage.TypeSVCB, 10 /* NULL */, 252 /* AXFR */, dnsmessage.TypeALL} {
				reply, sent := p.exchange(t, network, plainQuery(t, 7, "pkg.test.", typ))
				if len(sent) != 0 {
					t.Errorf("type %v over %s reached the upstream", typ, network)
				}
				// No data: what stub resolvers take without failing the lookup.
				if reply == nil || reply.Header.ID != 7 || reply.Header.RCode != dnsmessage.RCodeSuccess || len(reply.Answers) != 0 ||
					len(reply.Questions) != 1 || reply.Questions[0].Type != typ {
					t.Errorf("type %v over %s: reply %+v, want NOERROR without records", typ, network, reply)
				}
			}
		}
	})

	t.Run("mixed case", func(t *testing.T) {
		for _, network := range networks {
			reply, sent := p.exchange(t, network, plainQuery(t, 8, "PkG.TeSt.", dnsmessage.TypeA))
			asPlain(t, network, sent)
			if reply == nil || len(reply.Questions) != 1 || reply.Questions[0].Name.String() != "PkG.TeSt." || len(reply.Answers) != 1 {
				t.Errorf("reply %+v, want the guest's question echoed as asked, and the answer", reply)
			}
			_, sent = p.exchange(t, network, plainQuery(t, 8, "ExAmPlE.cDn.TeSt.", dnsmessage.TypeAAAA))
			if len(sent) != 1 {
				t.Fatalf("the upstream received %d queries, want 1", len(sent))
			}
			assertCleanQuery(t, sent[0].raw, "example.cdn.test.", dnsmessage.TypeAAAA)
		}
	})

	t.Run("two questions", func(t *testing.T) {
		for _, network := range networks {
			for _, qs := range [][]dnsmessage.Question{
				{question("pkg.test.", dnsmessage.TypeA), question("pkg.test.", dnsmessage.TypeAAAA)},
				{question("pkg.test.", dnsmessage.TypeA), question("a.cdn.test.", dnsmessage.TypeA)},
				{question("pkg.test.", dnsmessage.TypeA), question("pkg.test.", dnsmessage.TypeA)},
			} {
				reply, sent := p.exchange(t, network, buildQuery(t, dnsmessage.Header{ID: 9, RecursionDesired: true}, qs, nil))
				if len(sent) != 0 {
					t.Errorf("%d questions over %s reached the upstream", len(qs), network)
				}
				if reply == nil || reply.Header.ID != 9 || reply.Header.RCode != dnsmessage.RCodeFormatError {
					t.Errorf("%d questions over %s: reply %+v, want FORMERR", len(qs), network, reply)
				}
			}
		}
	})

	t.Run("EDNS options", func(t *testing.T) {
		opt := func(size int, do bool, version uint32, options ...dnsmessage.Option) func(b *dnsmessage.Builder) error {
			return func(b *dnsmessage.Builder) error {
				if err := b.StartAdditionals(); err != nil {
					return err
				}
				var h dnsmessage.ResourceHeader
				_ = h.SetEDNS0(size, dnsmessage.RCodeSuccess, do)
				h.TTL |= version << 16
				return b.OPTResource(h, dnsmessage.OPTResource{Options: options})
			}
		}
		for _, network := range networks {
			for i, extra := range []func(b *dnsmessage.Builder) error{
				opt(4096, false, 0, dnsmessage.Option{Code: 65001, Data: []byte("exfiltrated secret")}),
				opt(1232, true, 0, dnsmessage.Option{Code: 10, Data: []byte("cookie!!")}),             // COOKIE
				opt(1400, false, 0, dnsmessage.Option{Code: 8, Data: []byte{0, 1, 24, 0, 10, 88, 1}}), // CLIENT-SUBNET
				opt(512, false, 0, dnsmessage.Option{Code: 12, Data: bytes.Repeat([]byte("x"), 200)}), // PADDING
				opt(65535, true, 0),
				opt(600, false, 0),
			} {
				reply, sent := p.exchange(t, network, buildQuery(t, dnsmessage.Header{ID: 10, RecursionDesired: true}, []dnsmessage.Question{question("pkg.test.", dnsmessage.TypeA)}, extra))
				t.Run(fmt.Sprint(network, i), func(t *testing.T) {
					asPlain(t, network, sent)
					answered(t, reply, 10)
					if reply == nil {
						return
					}
					// The guest's OPT comes back without options either.
					for _, r := range reply.Additionals {
						if o, ok := r.Body.(*dnsmessage.OPTResource); !ok || len(o.Options) != 0 {
							t.Errorf("the guest's reply carries an additional record %v", r.GoString())
						}
					}
				})
			}
		}
	})

	t.Run("flags and opcode", func(t *testing.T) {
		for _, network := range networks {
			for i, h := range []dnsmessage.Header{
				{ID: 11},
				{ID: 11, RecursionDesired: true, Authoritative: true},
				{ID: 11, RecursionDesired: true, Truncated: true},
				{ID: 11, RecursionDesired: true, RecursionAvailable: true},
				{ID: 11, RecursionDesired: true, AuthenticData: true},
				{ID: 11, RecursionDesired: true, CheckingDisabled: true},
				{ID: 11, RecursionDesired: true, RCode: dnsmessage.RCodeRefused},
				{ID: 11, Authoritative: true, Truncated: true, AuthenticData: true, CheckingDisabled: true, RCode: 15},
			} {
				query := buildQuery(t, h, []dnsmessage.Question{question("pkg.test.", dnsmessage.TypeA)}, nil)
				_, sent := p.exchange(t, network, query)
				t.Run(fmt.Sprint(network, i), func(t *testing.T) { asPlain(t, network, sent) })
			}
			// The Z bit, which dnsmessage does not model.
			query := plainQuery(t, 11, "pkg.test.", dnsmessage.TypeA)
			query[3] |= 0x40
			reply, sent := p.exchange(t, network, query)
			t.Run(network+" Z bit", func(t *testing.T) { asPlain(t, network, sent); answered(t, reply, 11) })

			for _, op := range []dnsmessage.OpCode{1, 2, 4, 5, 15} {
				reply, sent := p.exchange(t, network, buildQuery(t, dnsmessage.Header{ID: 12, OpCode: op, RecursionDesired: true}, []dnsmessage.Question{question("pkg.test.", dnsmessage.TypeA)}, nil))
				if len(sent) != 0 {
					t.Errorf("opcode %d over %s reached the upstream", op, network)
				}
				if reply == nil || reply.Header.ID != 12 || reply.Header.RCode != dnsmessage.RCodeNotImplemented {
					t.Errorf("opcode %d over %s: reply %+v, want NOTIMP", op, network, reply)
				}
			}
		}
	})

	t.Run("ID", func(t *testing.T) {
		const guestID = 0x2a2a
		for _, network := range networks {
			var ids []uint16
			for range 8 {
				reply, sent := p.exchange(t, network, plainQuery(t, guestID, "pkg.test.", dnsmessage.TypeA))
				asPlain(t, network, sent)
				answered(t, reply, guestID) // the guest's ID restored
				if len(sent) == 1 {
					ids = append(ids, binary.BigEndian.Uint16(sent[0].raw))
				}
			}
			same := 0
			for _, id := range ids {
				if id == guestID {
					same++
				}
			}
			// Random IDs: one may match the guest's by chance (1 in 8192
			// here), two do not.
			if slices.Sort(ids); same > 1 || len(slices.Compact(ids)) < 2 {
				t.Errorf("over %s the upstream received IDs %04x for 8 queries with ID %04x, want the proxy's own random IDs", network, ids, guestID)
			}
		}
	})

	t.Run("extra sections", func(t *testing.T) {
		extra := func(b *dnsmessage.Builder) error {
			if err := b.StartAnswers(); err != nil {
				return err
			}
			r := aRecord("pkg.test.", upstreamA, 1)
			if err := b.AResource(r.Header, *r.Body.(*dnsmessage.AResource)); err != nil {
				return err
			}
			if err := b.StartAuthorities(); err != nil {
				return err
			}
			txt := txtRecord("pkg.test.", "authority payload")
			if err := b.TXTResource(txt.Header, *txt.Body.(*dnsmessage.TXTResource)); err != nil {
				return err
			}
			if err := b.StartAdditionals(); err != nil {
				return err
			}
			txt = txtRecord("exfil.pkg.test.", "additional payload")
			return b.TXTResource(txt.Header, *txt.Body.(*dnsmessage.TXTResource))
		}
		for _, network := range networks {
			reply, sent := p.exchange(t, network, buildQuery(t, dnsmessage.Header{ID: 13, RecursionDesired: true}, []dnsmessage.Question{question("pkg.test.", dnsmessage.TypeA)}, extra))
			asPlain(t, network, sent)
			answered(t, reply, 13)
		}
	})

	t.Run("bytes outside host names", func(t *testing.T) {
		// A wildcard allows any label below it; only host-name bytes may
		// reach the upstream in it.
		for _, network := range networks {
			for _, name := range []string{"\x01\xffdata.cdn.test.", "a b.cdn.test.", "a\x00.cdn.test."} {
				reply, sent := p.exchange(t, network, plainQuery(t, 14, name, dnsmessage.TypeA))
				if len(sent) != 0 {
					t.Errorf("%q over %s reached the upstream", name, network)
				}
				if reply == nil || reply.Header.RCode != dnsmessage.RCodeRefused {
					t.Errorf("%q over %s: reply %+v, want REFUSED", name, network, reply)
				}
			}
		}
	})
}
