package network

import (
	"net/netip"
	"testing"
)

func TestGuestSubnetsSplitTheClusterRange(t *testing.T) {
	s, err := NewGuestSubnets(netip.MustParsePrefix("10.88.0.0/16"), 24)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Gateway(); got != netip.MustParsePrefix("10.88.0.1/16") {
		t.Errorf("Gateway() = %s, want 10.88.0.1/16", got)
	}
	var all []netip.Prefix
	for p := range s.Candidates {
		all = append(all, p)
	}
	// 256 /24s, less the gateway's.
	if len(all) != 255 || all[0] != netip.MustParsePrefix("10.88.1.0/24") || all[254] != netip.MustParsePrefix("10.88.255.0/24") {
		t.Fatalf("candidates: %d, first %v, last %v; want 255 from 10.88.1.0/24 to 10.88.255.0/24", len(all), all[0], all[len(all)-1])
	}
	for _, c := range []struct {
		p     string
		valid bool
	}{
		{"10.88.7.0/24", true},
		{"10.88.0.0/24", false}, // the gateway's
		{"10.88.7.0/25", false},
		{"10.89.7.0/24", false},
	} {
		if got := s.Valid(netip.MustParsePrefix(c.p)); got != c.valid {
			t.Errorf("Valid(%s) = %v, want %v", c.p, got, c.valid)
		}
	}
	if got := s.Valid(netip.PrefixFrom(netip.MustParseAddr("10.88.7.5"), 24)); got {
		t.Error("Valid accepted a prefix that is not masked")
	}
	if got, want := SubnetClaimName(netip.MustParsePrefix("10.88.7.0/24")), "kairon-guest-subnet-10-88-7-0-24"; got != want {
		t.Errorf("SubnetClaimName = %q, want %q", got, want)
	}

	small, err := NewGuestSubnets(netip.MustParsePrefix("172.20.0.0/22"), 26)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for p := range small.Candidates {
		if n == 0 && p != netip.MustParsePrefix("172.20.0.64/26") {
			t.Errorf("first /26 of 172.20.0.0/22: %s, want 172.20.0.64/26", p)
		}
		n++
	}
	if n != 15 {
		t.Errorf("%d /26 subnets of a /22, want 15", n)
	}
}

func TestGuestSubnetsRefuseBadRanges(t *testing.T) {
	for _, c := range []struct {
		cluster string
		bits    int
	}{
		{"10.88.0.0/16", 16},
		{"10.88.0.0/16", 30},
		{"fd00::/48", 64},
		{"10.0.0.0/8", 25},
	} {
		if _, err := NewGuestSubnets(netip.MustParsePrefix(c.cluster), c.bits); err == nil {
			t.Errorf("NewGuestSubnets(%s, %d) accepted", c.cluster, c.bits)
		}
	}
}

func TestParseCrossNodeMode(t *testing.T) {
	for _, s := range []string{"none", "host", "vxlan"} {
		if m, err := ParseCrossNodeMode(s); err != nil || string(m) != s {
			t.Errorf("ParseCrossNodeMode(%q) = %q, %v", s, m, err)
		}
	}
	if _, err := ParseCrossNodeMode("gre"); err == nil {
		t.Error("ParseCrossNodeMode accepted gre")
	}
}
