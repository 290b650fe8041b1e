package network

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
)

func TestIPAMAllocatesLowestFreeAndPersists(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ipam.json")
	ipam, err := NewIPAM(netip.MustParsePrefix("10.88.0.0/29"), netip.Prefix{}, file)
	if err != nil {
		t.Fatal(err)
	}
	if got := ipam.Gateway().String(); got != "10.88.0.1/29" {
		t.Errorf("gateway = %s", got)
	}
	// A /29 has 8 addresses: network, gateway, broadcast leave five.
	want := []string{"10.88.0.2/29", "10.88.0.3/29", "10.88.0.4/29", "10.88.0.5/29", "10.88.0.6/29"}
	for i, w := range want {
		got, err := ipam.Allocate(string(rune('a' + i)))
		if err != nil || got.String() != w {
			t.Fatalf("allocation %d = %v, %v; want %s", i, got, err, w)
		}
	}
	if _, err := ipam.Allocate("f"); err == nil || !strings.Contains(err.Error(), "is full") {
		t.Fatalf("allocation past the range: %v", err)
	}
	if got, _ := ipam.Allocate("c"); got.String() != "10.88.0.4/29" {
		t.Errorf("re-allocating c = %s, want its old address", got)
	}
	if err := ipam.Release("b"); err != nil {
		t.Fatal(err)
	}
	if addr, ok := ipam.Lookup("c"); !ok || addr.String() != "10.88.0.4" {
		t.Errorf("Lookup(c) = %v, %v; want 10.88.0.4", addr, ok)
	}
	if addr, ok := ipam.Lookup("b"); ok {
		t.Errorf("Lookup(b) after its release = %v; want none", addr)
	}
	if _, ok := ipam.Lookup("never"); ok || len(ipam.Allocated()) != 4 {
		t.Errorf("Lookup of an unknown id found it, or assigned it: allocated %v", ipam.Allocated())
	}

	reloaded, err := NewIPAM(netip.MustParsePrefix("10.88.0.0/29"), netip.Prefix{}, file)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(reloaded.Allocated(), ","); got != "a,c,d,e" {
		t.Errorf("after reload allocated = %s", got)
	}
	if got, _ := reloaded.Allocate("new"); got.String() != "10.88.0.3/29" {
		t.Errorf("freed address not reused: got %s", got)
	}
	if got, _ := reloaded.Allocate("a"); got.String() != "10.88.0.2/29" {
		t.Errorf("a lost its address across reload: %s", got)
	}
}

func TestIPAMRefusesBadRanges(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct{ prefix, want string }{
		{"10.88.0.0/30", "/29 or larger"},
		{"fd00::/64", "IPv4"},
	} {
		if _, err := NewIPAM(netip.MustParsePrefix(tt.prefix), netip.Prefix{}, filepath.Join(dir, "x.json")); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want %q", tt.prefix, err, tt.want)
		}
	}
	file := filepath.Join(dir, "ipam.json")
	first, _ := NewIPAM(netip.MustParsePrefix("10.88.0.0/24"), netip.Prefix{}, file)
	if _, err := first.Allocate("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := NewIPAM(netip.MustParsePrefix("10.89.0.0/24"), netip.Prefix{}, file); err == nil || !strings.Contains(err.Error(), "holds addresses from 10.88.0.0/24") {
		t.Errorf("changed range accepted: %v", err)
	}
}

func TestNamesAreStableAndShort(t *testing.T) {
	first, again := TapName("node-1", "ns_a"), TapName("node-1", "ns_a")
	if first != again || first == TapName("node-1", "ns_b") || first == TapName("node-2", "ns_a") {
		t.Error("tap names are not stable and distinct")
	}
	if n := len(TapName("node-1", strings.Repeat("x", 300))); n > 15 {
		t.Errorf("tap name has %d characters; Linux allows 15", n)
	}
	if mac := MAC("ns_a"); !strings.HasPrefix(mac, "52:54:00:") || len(mac) != 17 {
		t.Errorf("MAC = %s", mac)
	}
}

func TestIPAMAllocatePreferring(t *testing.T) {
	ipam, err := NewIPAM(netip.MustParsePrefix("10.9.0.0/29"), netip.Prefix{}, filepath.Join(t.TempDir(), "ipam.json"))
	if err != nil {
		t.Fatal(err)
	}
	taken, _ := ipam.Allocate("first") // 10.9.0.2
	for _, tc := range []struct {
		id, preferred, want string
	}{
		{"migrated", "10.9.0.5", "10.9.0.5/29"}, // free: kept
		{"clash", "10.9.0.2", "10.9.0.3/29"},    // taken by "first": lowest free
		{"foreign", "10.88.1.7", "10.9.0.4/29"}, // another node's range
		{"gateway", "10.9.0.1", "10.9.0.6/29"},  // never the bridge's
		{"migrated", "10.9.0.6", "10.9.0.5/29"}, // already has one: unchanged
		{"broadcast", "10.9.0.7", ""},           // never broadcast; range now full
	} {
		var preferred netip.Addr
		if tc.preferred != "" {
			preferred = netip.MustParseAddr(tc.preferred)
		}
		got, err := ipam.AllocatePreferring(tc.id, preferred)
		if tc.want == "" {
			if err == nil {
				t.Errorf("%s preferring %s: got %s, want the range full", tc.id, tc.preferred, got)
			}
			continue
		}
		if err != nil || got.String() != tc.want {
			t.Errorf("%s preferring %s: %s, %v; want %s", tc.id, tc.preferred, got, err, tc.want)
		}
	}
	if taken.String() != "10.9.0.2/29" {
		t.Errorf("first allocation %s", taken)
	}
}

// Two agents sharing one network hand out addresses from their own pools,
// and a guest migrated between them keeps the address its first pool gave.
func TestIPAMPoolsShareANetwork(t *testing.T) {
	network := netip.MustParsePrefix("10.88.0.0/16")
	one, err := NewIPAM(network, netip.MustParsePrefix("10.88.1.0/24"), filepath.Join(t.TempDir(), "ipam.json"))
	if err != nil {
		t.Fatal(err)
	}
	two, err := NewIPAM(network, netip.MustParsePrefix("10.88.2.0/24"), filepath.Join(t.TempDir(), "ipam.json"))
	if err != nil {
		t.Fatal(err)
	}
	if gw := one.Gateway().String(); gw != "10.88.0.1/16" || two.Gateway().String() != gw {
		t.Errorf("gateways %s and %s, want the network's 10.88.0.1/16 for both", gw, two.Gateway())
	}
	first, _ := one.Allocate("ns_a")
	if first.String() != "10.88.1.1/16" {
		t.Errorf("first allocation %s, want 10.88.1.1/16: the pool's first usable address with the network's prefix", first)
	}
	if got, _ := two.Allocate("ns_b"); !netip.MustParsePrefix("10.88.2.0/24").Contains(got.Addr()) {
		t.Errorf("second agent allocated %s outside its pool", got)
	}
	moved, err := two.AllocatePreferring("ns_a", first.Addr())
	if err != nil || moved != first {
		t.Errorf("migrated guest got %s, %v on the second agent, want its %s kept", moved, err, first)
	}
	if _, err := NewIPAM(network, netip.MustParsePrefix("10.89.0.0/24"), filepath.Join(t.TempDir(), "x.json")); err == nil || !strings.Contains(err.Error(), "not inside the network") {
		t.Errorf("pool outside the network: %v", err)
	}
}
