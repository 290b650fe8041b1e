package egress

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/net/dns/dnsmessage"
)

// A confined guest must not be able to tell the outside anything through
// its DNS beyond which allowed name it asks about: the proxy never forwards
// the guest's bytes. It reads the guest's query, keeps the few facts a
// resolver needs (the name, lower-cased, and the type) and asks the
// upstream a query of its own. Everything else the guest could vary - the
// ID, the flags, the letter case, extra questions, EDNS options and
// sizes, other records, unusual types - stays on the node.

const (
	// minUDPSize is the UDP answer every DNS client takes (RFC 1035).
	minUDPSize = 512
	// upstreamUDPSize is the payload size the proxy's own EDNS record
	// advertises, to the upstream and back to guests: DNS Flag Day 2020's
	// value, which no path fragments. A larger answer comes back
	// truncated and the guest asks again over TCP.
	upstreamUDPSize = 1232
)

// Query is a guest's question as the proxy understood it, or the proxy's
// own question to the upstream (then only ID, Name and Type are set).
type Query struct {
	ID   uint16
	Name string // canonical: lower case, no trailing dot
	Type dnsmessage.Type
	// Asked and Class are the question exactly as the guest sent it,
	// echoed in its answer (resolvers that randomize the case of their
	// names check it comes back). They never leave the node.
	Asked dnsmessage.Name
	Class dnsmessage.Class
	// RecursionDesired is echoed, as RFC 1035 asks.
	RecursionDesired bool
	// EDNS says the guest sent an OPT record: its answer carries one.
	EDNS bool
	// UDPSize is the largest UDP answer the guest takes.
	UDPSize int
}

// hasQuestion says whether the guest's question is known, to be echoed.
func (q *Query) hasQuestion() bool { return q.Asked.Length > 0 }

// QueryError is a guest's query the proxy answers itself with RCode.
type QueryError struct {
	RCode  dnsmessage.RCode
	Reason string
}

func (e *QueryError) Error() string { return e.Reason + " (" + e.RCode.String() + ")" }

func queryError(rcode dnsmessage.RCode, format string, args ...any) error {
	return &QueryError{RCode: rcode, Reason: fmt.Sprintf(format, args...)}
}

// rcodeOf is the answer to a query ParseQuery refused with err.
func rcodeOf(err error) dnsmessage.RCode {
	if qe := (*QueryError)(nil); errors.As(err, &qe) {
		return qe.RCode
	}
	return dnsmessage.RCodeFormatError
}

// ParseQuery reads a guest's query defensively: a standard query with
// exactly one question of class IN; an OPT record in the additional
// section says how large a UDP answer the guest takes. Whatever else the
// message holds is read past and dropped. On error, the Query holds what
// was read (the ID, and the question once read) for the refusal, and the
// error is a *QueryError with the rcode to answer: FORMERR for a message
// that is not one query with one question, NOTIMP for another opcode,
// REFUSED for a class other than IN.
func ParseQuery(msg []byte) (Query, error) {
	q := Query{UDPSize: minUDPSize}
	if len(msg) >= 2 {
		q.ID = binary.BigEndian.Uint16(msg)
	}
	if len(msg) > maxDNSMessage {
		return q, queryError(dnsmessage.RCodeFormatError, "query too long")
	}
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		return q, queryError(dnsmessage.RCodeFormatError, "header: %v", err)
	}
	q.RecursionDesired = h.RecursionDesired
	if h.Response {
		return q, queryError(dnsmessage.RCodeFormatError, "a response, not a query")
	}
	if h.OpCode != 0 {
		return q, queryError(dnsmessage.RCodeNotImplemented, "opcode %d, want 0 (QUERY)", h.OpCode)
	}
	// One question read at a time: a message packed with questions must
	// not cost the agent a Name (255 bytes) for each.
	question, err := p.Question()
	if err != nil {
		return q, queryError(dnsmessage.RCodeFormatError, "question: %v", err)
	}
	if _, err := p.Question(); !errors.Is(err, dnsmessage.ErrSectionDone) {
		return q, queryError(dnsmessage.RCodeFormatError, "more than one question")
	}
	q.Asked, q.Class, q.Type = question.Name, question.Class, question.Type
	q.Name = canonicalName(question.Name.String())
	if err := p.SkipAllAnswers(); err != nil {
		return q, queryError(dnsmessage.RCodeFormatError, "answer section: %v", err)
	}
	if err := p.SkipAllAuthorities(); err != nil {
		return q, queryError(dnsmessage.RCodeFormatError, "authority section: %v", err)
	}
	for {
		rh, err := p.AdditionalHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			break
		}
		if err != nil {
			return q, queryError(dnsmessage.RCodeFormatError, "additional section: %v", err)
		}
		if rh.Type == dnsmessage.TypeOPT {
			if q.EDNS {
				return q, queryError(dnsmessage.RCodeFormatError, "more than one OPT record") // RFC 6891 6.1.1
			}
			// Only the size is used; the guest's options, flags and
			// version stay here.
			q.EDNS, q.UDPSize = true, min(max(int(rh.Class), minUDPSize), maxUDPQuery)
		}
		if err := p.SkipAdditional(); err != nil {
			return q, queryError(dnsmessage.RCodeFormatError, "additional section: %v", err)
		}
	}
	if q.Class != dnsmessage.ClassINET {
		return q, queryError(dnsmessage.RCodeRefused, "class %v, want IN", q.Class)
	}
	return q, nil
}

// forwardedType says whether the proxy asks the upstream about records of
// type t. Only addresses: they are what a guest needs to connect, what
// the enforcer learns, and all glibc's, musl's and Go's resolvers ask for
// (a CNAME comes with them). Every other type is answered on the node
// with NOERROR and no records ("no data"), which stub resolvers take in
// their stride: glibc and musl only ever ask A and AAAA; a browser asking
// HTTPS (65) or SVCB (64) records falls back to A and AAAA, as RFC 9460
// requires of it. HTTPS is not forwarded because its records carry
// opaque data (ECH configurations, parameters), names outside the
// policy (alias targets) and address hints the enforcer would have to
// learn: all for a speed-up. REFUSED or NOTIMP instead of no data would
// make resolvers try the next server, then fail the whole lookup.
func forwardedType(t dnsmessage.Type) bool {
	return t == dnsmessage.TypeA || t == dnsmessage.TypeAAAA
}

// hostName says whether name (canonical) is made of letters, digits,
// hyphens and underscores in labels of 1 to 63 bytes: the names policies
// can allow. Any other byte could only reach the upstream through a
// wildcard pattern, as a denser covert channel.
func hostName(name string) bool {
	if name == "" || len(name) > 253 {
		return false
	}
	label := 0
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c == '.':
			if label == 0 {
				return false
			}
			label = 0
			continue
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return false
		}
		if label++; label > 63 {
			return false
		}
	}
	return label > 0
}

// newQueryID is a fresh unpredictable ID for a query to the upstream: the
// guest's own ID would be 16 bits of its choosing on the wire, and a
// predictable one would help an off-path spoofer.
func newQueryID() uint16 {
	var b [2]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return binary.BigEndian.Uint16(b[:])
}

// upstreamQuery is the proxy's own query about ask.Name and ask.Type, with
// ask.ID: one question of class IN, recursion desired and no other flag,
// and an OPT record of the proxy's fixed size without options, the
// DNSSEC OK bit or an extended rcode.
func upstreamQuery(ask Query) ([]byte, error) {
	name, err := dnsmessage.NewName(ask.Name + ".")
	if err != nil {
		return nil, err
	}
	b := dnsmessage.NewBuilder(make([]byte, 0, 64+len(ask.Name)), dnsmessage.Header{ID: ask.ID, RecursionDesired: true})
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(dnsmessage.Question{Name: name, Type: ask.Type, Class: dnsmessage.ClassINET}); err != nil {
		return nil, err
	}
	if err := addOwnEDNS(&b); err != nil {
		return nil, err
	}
	return b.Finish()
}

// addOwnEDNS ends a message the proxy builds with its own EDNS record: the
// UDP size it takes, and no options.
func addOwnEDNS(b *dnsmessage.Builder) error {
	if err := b.StartAdditionals(); err != nil {
		return err
	}
	var opt dnsmessage.ResourceHeader
	if err := opt.SetEDNS0(upstreamUDPSize, dnsmessage.RCodeSuccess, false); err != nil {
		return err
	}
	return b.OPTResource(opt, dnsmessage.OPTResource{})
}
