package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

const (
	// maxAnswerRecords bounds the answer section the proxy reads: room
	// for maxLearned addresses and a CNAME chain, and more than any real
	// answer about one name. A longer one is refused, not skimmed.
	maxAnswerRecords = 128
	// maxCNAMEChain bounds the CNAMEs followed from the question's name.
	maxCNAMEChain = 16
)

// Answer is what an upstream response teaches: the addresses of the
// question's name (following CNAMEs in the answer) and their shortest TTL.
type Answer struct {
	RCode dnsmessage.RCode
	// Truncated: the upstream had more to say than fit; nothing was read.
	Truncated bool
	Addrs     []netip.Addr
	TTL       time.Duration
	// Records are the validated records the guest's answer is rebuilt
	// from, in the upstream's order: the CNAMEs of the chain and the
	// addresses, owners in canonical form.
	Records []dnsmessage.Resource
}

// ParseAnswer reads the upstream's response to ask, the proxy's own
// query, defensively: it must be a response with ask's ID to ask's one
// question (in canonical form), and of its answer records only those on
// the question's CNAME chain count, CNAMEs and addresses of ask.Type.
// Every other record, and the authority and additional sections, are
// left unread.
func ParseAnswer(ask Query, msg []byte) (Answer, error) {
	if len(msg) > maxDNSMessage {
		return Answer{}, errors.New("response too long")
	}
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		return Answer{}, err
	}
	if !h.Response || h.ID != ask.ID || h.OpCode != 0 {
		return Answer{}, errors.New("not the response to the query")
	}
	question, err := p.Question()
	if err != nil {
		return Answer{}, fmt.Errorf("question: %w", err)
	}
	if canonicalName(question.Name.String()) != ask.Name || question.Type != ask.Type || question.Class != dnsmessage.ClassINET {
		return Answer{}, errors.New("the response answers another question")
	}
	if _, err := p.Question(); !errors.Is(err, dnsmessage.ErrSectionDone) {
		return Answer{}, errors.New("the response answers more than one question")
	}
	a := Answer{RCode: h.RCode, Truncated: h.Truncated}
	if a.Truncated {
		return a, nil
	}
	// chain holds the names whose records answer the question: the name
	// and the targets of CNAMEs owned by a name already on it. cnamed
	// are the names whose CNAME was read: a name has at most one.
	chain := map[string]bool{ask.Name: true}
	cnamed := map[string]bool{}
	first := true
	var ttl uint32
	for n := 0; ; n++ {
		rh, err := p.AnswerHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			break
		}
		if err != nil {
			return Answer{}, err
		}
		if n >= maxAnswerRecords {
			return Answer{}, fmt.Errorf("more than %d answer records", maxAnswerRecords)
		}
		owner := canonicalName(rh.Name.String())
		if rh.Class != dnsmessage.ClassINET || !chain[owner] || (rh.Type != ask.Type && rh.Type != dnsmessage.TypeCNAME) {
			if err := p.SkipAnswer(); err != nil {
				return Answer{}, err
			}
			continue
		}
		// The owner, canonical: the guest sees only names validated here.
		rh.Name, err = dnsmessage.NewName(owner + ".")
		if err != nil {
			return Answer{}, err
		}
		var body dnsmessage.ResourceBody
		switch rh.Type {
		case dnsmessage.TypeA:
			r, err := p.AResource()
			if err != nil {
				return Answer{}, err
			}
			a.Addrs = append(a.Addrs, netip.AddrFrom4(r.A))
			body = &r
		case dnsmessage.TypeAAAA:
			r, err := p.AAAAResource()
			if err != nil {
				return Answer{}, err
			}
			a.Addrs = append(a.Addrs, netip.AddrFrom16(r.AAAA))
			body = &r
		case dnsmessage.TypeCNAME:
			r, err := p.CNAMEResource()
			if err != nil {
				return Answer{}, err
			}
			target := canonicalName(r.CNAME.String())
			switch {
			case cnamed[owner]:
				return Answer{}, fmt.Errorf("%s has two CNAMEs", owner)
			case chain[target]:
				return Answer{}, fmt.Errorf("CNAME loop at %s", target)
			case !hostName(target):
				return Answer{}, errors.New("CNAME to a name that is not a host name")
			case len(chain) > maxCNAMEChain:
				return Answer{}, fmt.Errorf("CNAME chain longer than %d", maxCNAMEChain)
			}
			cnamed[owner], chain[target] = true, true
			if r.CNAME, err = dnsmessage.NewName(target + "."); err != nil {
				return Answer{}, err
			}
			body = &r
		}
		a.Records = append(a.Records, dnsmessage.Resource{Header: rh, Body: body})
		if first || rh.TTL < ttl {
			ttl, first = rh.TTL, false
		}
	}
	a.TTL = time.Duration(ttl) * time.Second
	return a, nil
}

// reply is the guest's answer to q, built by the proxy: q's ID and
// question as the guest sent them, rcode, and records (from ParseAnswer)
// with TTLs above maxTTL (when positive) lowered to it, so that the guest
// does not cache an address longer than it stays allowed. Nothing else
// of the upstream's response reaches the guest: no authority or
// additional records (an SOA for negative caching included: without it a
// resolver just does not cache the negative answer), no flags but RA. An
// answer longer than limit bytes (when positive) goes back truncated,
// without records, and the guest asks again over TCP.
func reply(q *Query, rcode dnsmessage.RCode, records []dnsmessage.Resource, maxTTL time.Duration, limit int) []byte {
	out, err := buildReply(q, rcode, records, maxTTL, false)
	if err != nil {
		return nil
	}
	if limit > 0 && len(out) > limit {
		return truncatedReply(q, rcode)
	}
	return out
}

// truncatedReply tells the guest its answer did not fit (TC, no records):
// it asks again over TCP.
func truncatedReply(q *Query, rcode dnsmessage.RCode) []byte {
	out, err := buildReply(q, rcode, nil, 0, true)
	if err != nil {
		return nil
	}
	return out
}

// refusal is q's answer without records: rcode, or no data (NOERROR).
func refusal(q *Query, rcode dnsmessage.RCode) []byte {
	return reply(q, rcode, nil, 0, 0)
}

func buildReply(q *Query, rcode dnsmessage.RCode, records []dnsmessage.Resource, maxTTL time.Duration, truncated bool) ([]byte, error) {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{
		ID: q.ID, Response: true, RCode: rcode, Truncated: truncated,
		RecursionDesired: q.RecursionDesired, RecursionAvailable: true,
	})
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if q.hasQuestion() {
		if err := b.Question(dnsmessage.Question{Name: q.Asked, Type: q.Type, Class: q.Class}); err != nil {
			return nil, err
		}
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	ttlCap := uint32(maxTTL / time.Second)
	for _, r := range records {
		h := r.Header
		if canonicalName(h.Name.String()) == q.Name && q.hasQuestion() {
			h.Name = q.Asked // the guest's spelling of its own name
		}
		if ttlCap > 0 && h.TTL > ttlCap {
			h.TTL = ttlCap
		}
		var err error
		switch body := r.Body.(type) {
		case *dnsmessage.AResource:
			err = b.AResource(h, *body)
		case *dnsmessage.AAAAResource:
			err = b.AAAAResource(h, *body)
		case *dnsmessage.CNAMEResource:
			err = b.CNAMEResource(h, *body)
		default:
			err = fmt.Errorf("record of type %v", h.Type)
		}
		if err != nil {
			return nil, err
		}
	}
	if q.EDNS {
		if err := addOwnEDNS(&b); err != nil {
			return nil, err
		}
	}
	return b.Finish()
}
