package egress

import (
	"bytes"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// queryCorpus are guest queries, ordinary and odd, seeding the fuzzers.
func queryCorpus(t testing.TB) [][]byte {
	q := question("pkg.test.", dnsmessage.TypeA)
	opt := func(size int, options ...dnsmessage.Option) func(b *dnsmessage.Builder) error {
		return func(b *dnsmessage.Builder) error {
			if err := b.StartAdditionals(); err != nil {
				return err
			}
			var h dnsmessage.ResourceHeader
			_ = h.SetEDNS0(size, dnsmessage.RCodeSuccess, true)
			return b.OPTResource(h, dnsmessage.OPTResource{Options: options})
		}
	}
	zBit := plainQuery(t, 4, "pkg.test.", dnsmessage.TypeA)
	zBit[3] |= 0x40
	return [][]byte{
		plainQuery(t, 1, "pkg.test.", dnsmessage.TypeA),
		plainQuery(t, 2, "ExAmPlE.cDn.TeSt.", dnsmessage.TypeAAAA),
		plainQuery(t, 3, "pkg.test.", 43981),
		plainQuery(t, 3, "pkg.test.", dnsmessage.TypeHTTPS),
		plainQuery(t, 5, "\x01\xff.cdn.test.", dnsmessage.TypeA),
		zBit,
		buildQuery(t, dnsmessage.Header{ID: 6, RecursionDesired: true}, []dnsmessage.Question{q}, opt(4096, dnsmessage.Option{Code: 65001, Data: []byte("secret")})),
		buildQuery(t, dnsmessage.Header{ID: 7}, []dnsmessage.Question{q}, func(b *dnsmessage.Builder) error {
			if err := opt(1232)(b); err != nil {
				return err
			}
			return opt(512)(b) // a second OPT
		}),
		buildQuery(t, dnsmessage.Header{ID: 8, AuthenticData: true, CheckingDisabled: true, Truncated: true}, []dnsmessage.Question{q, q}, nil),
		buildQuery(t, dnsmessage.Header{ID: 9, OpCode: 5}, []dnsmessage.Question{q}, nil),
		buildQuery(t, dnsmessage.Header{ID: 10}, []dnsmessage.Question{{Name: q.Name, Type: q.Type, Class: dnsmessage.ClassCHAOS}}, nil),
		buildQuery(t, dnsmessage.Header{ID: 11, Response: true}, []dnsmessage.Question{q}, nil),
		{},
		{0x12},
		{0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 3, 'p', 'k', 'g', 0xc0, 0x0c, 0, 1, 0, 1},
	}
}

// FuzzDNSProxyQuery: whatever a guest sends, the proxy's answer to it
// parses and carries its ID; and when the proxy would ask the upstream,
// it asks a clean query (see assertCleanQuery) about the lower-cased name
// and an address type, byte for byte the query a plain question about
// that name and type makes.
func FuzzDNSProxyQuery(f *testing.F) {
	for _, msg := range queryCorpus(f) {
		f.Add(msg)
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		q, err := ParseQuery(msg)
		if err != nil {
			checkReply(t, &q, refusal(&q, rcodeOf(err)))
			return
		}
		if q.Name != canonicalName(q.Name) {
			t.Fatalf("name %q is not canonical", q.Name)
		}
		if q.UDPSize < minUDPSize || q.UDPSize > maxUDPQuery {
			t.Fatalf("UDP size %d", q.UDPSize)
		}
		checkReply(t, &q, refusal(&q, dnsmessage.RCodeRefused))
		if !hostName(q.Name) || !forwardedType(q.Type) {
			return // answered on the node
		}
		const id = 0x5a5a
		sent, err := upstreamQuery(Query{ID: id, Name: q.Name, Type: q.Type})
		if err != nil {
			t.Fatalf("no upstream query for %q: %v", q.Name, err)
		}
		assertCleanQuery(t, sent, q.Name+".", q.Type)
		plain, err := ParseQuery(plainQuery(t, 1, q.Name+".", q.Type))
		if err != nil {
			t.Fatal(err)
		}
		if want, _ := upstreamQuery(Query{ID: id, Name: plain.Name, Type: plain.Type}); !bytes.Equal(sent, want) {
			t.Fatalf("upstream query\n%x\nwant the plain question's\n%x", sent, want)
		}
		// The upstream's answer, validated and rebuilt for the guest.
		resp := (&fakeUpstream{}).respond("udp", sent)
		a, err := ParseAnswer(Query{ID: id, Name: q.Name, Type: q.Type}, resp)
		if err != nil || len(a.Records) != 1 || len(a.Addrs) != 1 {
			t.Fatalf("the upstream's answer: %+v, %v", a, err)
		}
		if m := checkReply(t, &q, reply(&q, a.RCode, a.Records, time.Hour, 0)); len(m.Answers) != 1 || m.Answers[0].Header.Name != q.Asked {
			t.Fatalf("reply answers %v, want one record of %v", answerStrings(m), q.Asked)
		}
	})
}

// checkReply fails unless out, the guest's reply to q, parses, carries
// q's ID and echoes its question when it was read.
func checkReply(t *testing.T, q *Query, out []byte) *dnsmessage.Message {
	t.Helper()
	var m dnsmessage.Message
	if err := m.Unpack(out); err != nil {
		t.Fatalf("reply %x does not parse: %v", out, err)
	}
	if !m.Header.Response || m.Header.ID != q.ID {
		t.Fatalf("reply header %+v, want a response with ID %d", m.Header, q.ID)
	}
	if q.hasQuestion() && (len(m.Questions) != 1 || m.Questions[0].Name != q.Asked || m.Questions[0].Type != q.Type || m.Questions[0].Class != q.Class) {
		t.Fatalf("reply questions %v, want %v %v %v", m.Questions, q.Asked, q.Type, q.Class)
	}
	return &m
}

// FuzzDNSProxyAnswer: whatever the upstream answers, what ParseAnswer
// accepts is records on the question's chain of the asked type or CNAME,
// and the guest's reply rebuilt from them parses and holds those alone.
func FuzzDNSProxyAnswer(f *testing.F) {
	ask := Query{ID: 0x5a5a, Name: "pkg.test", Type: dnsmessage.TypeA}
	sent, err := upstreamQuery(ask)
	if err != nil {
		f.Fatal(err)
	}
	for _, edit := range []func(m *dnsmessage.Message){
		func(*dnsmessage.Message) {},
		func(m *dnsmessage.Message) {
			m.Answers = []dnsmessage.Resource{cnameRecord("pkg.test.", "Edge.example.", 60), aRecord("edge.example.", upstreamA, 30), aRecord("evil.test.", upstreamA, 1)}
		},
		func(m *dnsmessage.Message) {
			m.Answers = append(m.Answers, txtRecord("pkg.test.", "data"))
			m.Additionals = []dnsmessage.Resource{txtRecord("pkg.test.", "more")}
		},
		func(m *dnsmessage.Message) { m.Header.Truncated = true },
		func(m *dnsmessage.Message) { m.Header.RCode = dnsmessage.RCodeNameError; m.Answers = nil },
	} {
		u := &fakeUpstream{edit: func(m *dnsmessage.Message, _ string) { edit(m) }}
		f.Add(u.respond("udp", sent))
	}
	guest, err := ParseQuery(plainQuery(f, 77, "PKG.test.", dnsmessage.TypeA))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		a, err := ParseAnswer(ask, msg)
		if err != nil {
			return
		}
		if a.Truncated && len(a.Records) > 0 {
			t.Fatal("records read from a truncated answer")
		}
		if len(a.Records) > maxAnswerRecords {
			t.Fatalf("%d records", len(a.Records))
		}
		chain := map[string]bool{ask.Name: true}
		for _, r := range a.Records {
			owner := r.Header.Name.String()
			if owner != canonicalName(owner)+"." || !chain[canonicalName(owner)] {
				t.Fatalf("record of %q, not on the chain %v", owner, chain)
			}
			switch b := r.Body.(type) {
			case *dnsmessage.CNAMEResource:
				chain[canonicalName(b.CNAME.String())] = true
			case *dnsmessage.AResource:
			default:
				t.Fatalf("record of type %v", r.Header.Type)
			}
		}
		m := checkReply(t, &guest, reply(&guest, a.RCode, a.Records, time.Hour, maxDNSMessage))
		if len(m.Answers) != len(a.Records) || len(m.Authorities) != 0 || len(m.Additionals) != 0 {
			t.Fatalf("reply %+v, want the %d records alone", m, len(a.Records))
		}
		for _, r := range m.Answers {
			if r.Header.TTL > 3600 {
				t.Fatalf("TTL %d above the cap", r.Header.TTL)
			}
		}
	})
}
