package egress

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// TestDNSProxyValidatesAnswers: what the upstream answers is checked
// before the enforcer learns anything from it, and the guest gets an
// answer rebuilt from the records that passed, nothing else.
func TestDNSProxyValidatesAnswers(t *testing.T) {
	p := newProxyUnderTest(t)
	addr := func(last byte) netip.Addr { return netip.AddrFrom4([4]byte{203, 0, 113, last}) }
	// failed asks over network and expects SERVFAIL, with nothing learned
	// of addrs.
	failed := func(t *testing.T, network string, addrs ...netip.Addr) {
		t.Helper()
		reply, sent := p.exchange(t, network, plainQuery(t, 21, "pkg.test.", dnsmessage.TypeA))
		if len(sent) != 1 {
			t.Errorf("the upstream received %d queries, want 1", len(sent))
		}
		if reply == nil || reply.Header.ID != 21 || reply.Header.RCode != dnsmessage.RCodeServerFailure || len(reply.Answers) != 0 {
			t.Errorf("reply %v, want SERVFAIL without records", answerStringsOrNil(reply))
		}
		for _, a := range addrs {
			if p.learned(t, a) {
				t.Errorf("%v was learned", a)
			}
		}
	}
	// answered asks over network and expects NOERROR with want.
	answered := func(t *testing.T, network string, query []byte, want ...string) *dnsmessage.Message {
		t.Helper()
		reply, _ := p.exchange(t, network, query)
		if reply == nil || reply.Header.RCode != dnsmessage.RCodeSuccess || reply.Header.Truncated || !slices.Equal(answerStrings(reply), want) {
			t.Fatalf("reply %+v\nanswers %q, want %q", reply, answerStringsOrNil(reply), want)
		}
		return reply
	}
	t.Cleanup(func() { p.upstream.answerWith(nil) })

	t.Run("another ID", func(t *testing.T) {
		p.upstream.answerWith(func(m *dnsmessage.Message, _ string) {
			m.Header.ID ^= 0x5555
			m.Answers = []dnsmessage.Resource{aRecord("pkg.test.", addr(21), 60)}
		})
		failed(t, "udp", addr(21))
		failed(t, "tcp", addr(21))
	})
	t.Run("another question", func(t *testing.T) {
		p.upstream.answerWith(func(m *dnsmessage.Message, _ string) {
			m.Questions[0].Name = dnsmessage.MustNewName("other.test.")
			m.Answers = []dnsmessage.Resource{aRecord("other.test.", addr(22), 60), aRecord("pkg.test.", addr(22), 60)}
		})
		failed(t, "udp", addr(22))
		p.upstream.answerWith(func(m *dnsmessage.Message, _ string) {
			m.Questions[0].Type = dnsmessage.TypeAAAA
			m.Answers = []dnsmessage.Resource{aRecord("pkg.test.", addr(22), 60)}
		})
		failed(t, "udp", addr(22))
		p.upstream.answerWith(func(m *dnsmessage.Message, _ string) {
			m.Questions = append(m.Questions, question("other.test.", dnsmessage.TypeA))
			m.Answers = []dnsmessage.Resource{aRecord("pkg.test.", addr(22), 60)}
		})
		failed(t, "udp", addr(22))
	})
	t.Run("records of other names, types and sections", func(t *testing.T) {
		p.upstream.answerWith(func(m *dnsmessage.Message, _ string) {
			m.Answers = []dnsmessage.Resource{
				aRecord("evil.test.", addr(23), 60),
				aRecord("pkg.test.", addr(10), 60),
				{Header: dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName("pkg.test."), Type: dnsmessage.TypeAAAA, Class: dnsmessage.ClassINET, TTL: 60},
					Body: &dnsmessage.AAAAResource{AAAA: netip.MustParseAddr("2001:db8::23").As16()}},
				txtRecord("pkg.test.", "inbound payload"),
				{Header: dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName("pkg.test."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassCHAOS, TTL: 60},
					Body: &dnsmessage.AResource{A: addr(24).As4()}},
			}
			m.Authorities = []dnsmessage.Resource{txtRecord("pkg.test.", "authority payload")}
			m.Additionals = []dnsmessage.Resource{aRecord("evil.test.", addr(25), 60), txtRecord("pkg.test.", "additional payload")}
		})
		for _, network := range []string{"udp", "tcp"} {
			reply := answered(t, network, plainQuery(t, 23, "pkg.test.", dnsmessage.TypeA), "pkg.test. TypeA 203.0.113.10 60")
			if len(reply.Authorities) != 0 || len(reply.Additionals) != 0 {
				t.Errorf("the guest got authority %v and additional %v records", reply.Authorities, reply.Additionals)
			}
		}
		if !p.learned(t, addr(10)) {
			t.Error("pkg.test's address was not learned")
		}
		for _, a := range []netip.Addr{addr(23), addr(24), addr(25)} {
			if p.learned(t, a) {
				t.Errorf("%v was learned", a)
			}
		}
	})
	t.Run("CNAME chain", func(t *testing.T) {
		p.upstream.answerWith(func(m *dnsmessage.Message, _ string) {
			m.Answers = []dnsmessage.Resource{
				cnameRecord("pkg.test.", "Edge.CDN.example.", 300),
				aRecord("stray.example.", addr(27), 60),
				aRecord("edge.cdn.example.", addr(26), 30),
				cnameRecord("stray.example.", "pkg.test.", 60),
			}
		})
		answered(t, "udp", plainQuery(t, 24, "pkg.test.", dnsmessage.TypeA),
			"pkg.test. TypeCNAME edge.cdn.example. 300", "edge.cdn.example. TypeA 203.0.113.26 30")
		if !p.learned(t, addr(26)) || p.learned(t, addr(27)) {
			t.Error("learned, want 203.0.113.26 and not 203.0.113.27")
		}
		for name, chain := range map[string][]dnsmessage.Resource{
			"loop":  {cnameRecord("pkg.test.", "a.example.", 60), cnameRecord("a.example.", "pkg.test.", 60), aRecord("a.example.", addr(28), 60)},
			"fork":  {cnameRecord("pkg.test.", "a.example.", 60), cnameRecord("pkg.test.", "b.example.", 60), aRecord("b.example.", addr(28), 60)},
			"bytes": {cnameRecord("pkg.test.", "\x01\x02payload.example.", 60), aRecord("\x01\x02payload.example.", addr(28), 60)},
		} {
			p.upstream.answerWith(func(m *dnsmessage.Message, _ string) { m.Answers = chain })
			t.Run(name, func(t *testing.T) { failed(t, "udp", addr(28)) })
		}
	})
	t.Run("flood of records", func(t *testing.T) {
		p.upstream.answerWith(func(m *dnsmessage.Message, _ string) {
			m.Answers = []dnsmessage.Resource{aRecord("pkg.test.", addr(29), 60)}
			for i := range 1000 {
				m.Answers = append(m.Answers, txtRecord("pkg.test.", strings.Repeat("x", i%50)))
			}
		})
		failed(t, "tcp", addr(29))
		p.upstream.answerWith(func(m *dnsmessage.Message, _ string) {
			m.Answers = nil
			for i := range maxLearned + 1 {
				m.Answers = append(m.Answers, aRecord("pkg.test.", netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), 60))
			}
		})
		failed(t, "tcp", netip.MustParseAddr("198.51.100.0"))
	})
	t.Run("rcodes", func(t *testing.T) {
		p.upstream.answerWith(func(m *dnsmessage.Message, _ string) { m.Header.RCode, m.Answers = dnsmessage.RCodeNameError, nil })
		reply, _ := p.exchange(t, "udp", plainQuery(t, 25, "pkg.test.", dnsmessage.TypeA))
		if reply == nil || reply.Header.RCode != dnsmessage.RCodeNameError {
			t.Errorf("reply %+v, want NXDOMAIN", reply)
		}
		// Other rcodes would be 4 more bits from the outside: SERVFAIL.
		p.upstream.answerWith(func(m *dnsmessage.Message, _ string) { m.Header.RCode, m.Answers = 11, nil })
		failed(t, "udp")
	})
	t.Run("TTL above the enforcer's longest", func(t *testing.T) {
		p.upstream.answerWith(func(m *dnsmessage.Message, _ string) {
			m.Answers = []dnsmessage.Resource{aRecord("pkg.test.", addr(10), 86400)}
		})
		longest := uint32(p.n.enforcer.MaxTTL / time.Second)
		if longest == 0 || longest >= 86400 {
			t.Fatalf("the enforcer's MaxTTL is %v", p.n.enforcer.MaxTTL)
		}
		answered(t, "udp", plainQuery(t, 26, "pkg.test.", dnsmessage.TypeA), "pkg.test. TypeA 203.0.113.10 "+strconv.FormatUint(uint64(longest), 10))
	})
	t.Run("upstream's case", func(t *testing.T) {
		p.upstream.answerWith(func(m *dnsmessage.Message, _ string) {
			m.Questions[0].Name = dnsmessage.MustNewName("PKG.TEST.")
			m.Answers = []dnsmessage.Resource{aRecord("Pkg.Test.", addr(10), 60)}
		})
		reply := answered(t, "udp", plainQuery(t, 27, "pkG.test.", dnsmessage.TypeA), "pkG.test. TypeA 203.0.113.10 60")
		if reply.Questions[0].Name.String() != "pkG.test." {
			t.Errorf("question %v, want the guest's", reply.Questions[0].Name)
		}
	})
	t.Run("truncated upstream", func(t *testing.T) {
		p.upstream.answerWith(func(m *dnsmessage.Message, network string) {
			m.Answers = []dnsmessage.Resource{aRecord("pkg.test.", addr(30), 60)}
			m.Header.Truncated = network == "udp"
		})
		reply, _ := p.exchange(t, "udp", plainQuery(t, 28, "pkg.test.", dnsmessage.TypeA))
		if reply == nil || !reply.Header.Truncated || len(reply.Answers) != 0 {
			t.Fatalf("over UDP: reply %+v, want TC without records", reply)
		}
		if p.learned(t, addr(30)) {
			t.Error("an address of a truncated answer was learned")
		}
		answered(t, "tcp", plainQuery(t, 28, "pkg.test.", dnsmessage.TypeA), "pkg.test. TypeA 203.0.113.30 60")
		if !p.learned(t, addr(30)) {
			t.Error("the address answered over TCP was not learned")
		}
	})
	t.Run("longer than the guest takes over UDP", func(t *testing.T) {
		var want []string
		p.upstream.answerWith(func(m *dnsmessage.Message, _ string) {
			m.Answers = nil
			for i := range 40 {
				m.Answers = append(m.Answers, aRecord("pkg.test.", addr(byte(100+i)), 60))
			}
		})
		for i := range 40 {
			want = append(want, "pkg.test. TypeA "+addr(byte(100+i)).String()+" 60")
		}
		reply, _ := p.exchange(t, "udp", plainQuery(t, 29, "pkg.test.", dnsmessage.TypeA))
		if reply == nil || !reply.Header.Truncated || len(reply.Answers) != 0 {
			t.Fatalf("over UDP without EDNS: reply %v, want TC without records", answerStringsOrNil(reply))
		}
		edns := buildQuery(t, dnsmessage.Header{ID: 29, RecursionDesired: true}, []dnsmessage.Question{question("pkg.test.", dnsmessage.TypeA)}, func(b *dnsmessage.Builder) error {
			if err := b.StartAdditionals(); err != nil {
				return err
			}
			var h dnsmessage.ResourceHeader
			_ = h.SetEDNS0(4096, dnsmessage.RCodeSuccess, false)
			return b.OPTResource(h, dnsmessage.OPTResource{})
		})
		answered(t, "udp", edns, want...)
		answered(t, "tcp", plainQuery(t, 29, "pkg.test.", dnsmessage.TypeA), want...)
	})
}

func answerStringsOrNil(m *dnsmessage.Message) []string {
	if m == nil {
		return nil
	}
	return answerStrings(m)
}
