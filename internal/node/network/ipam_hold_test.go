package network

import (
	"net/netip"
	"path/filepath"
	"reflect"
	"testing"
)

// A guest that left the node may still have its address: held, it is
// handed to no one, survives an agent restart, comes back to the guest if
// the guest returns, and is freed only when the cluster no longer shows it.
func TestIPAMHoldsTheAddressOfAGuestThatLeft(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ipam.json")
	network, pool := netip.MustParsePrefix("10.88.0.0/16"), netip.MustParsePrefix("10.88.2.0/24")
	ipam, err := NewIPAM(network, pool, file)
	if err != nil {
		t.Fatal(err)
	}
	moved, err := ipam.Allocate("default_moved")
	if err != nil {
		t.Fatal(err)
	}
	if err := ipam.Hold("default_moved"); err != nil {
		t.Fatal(err)
	}
	if _, ok := ipam.Lookup("default_moved"); ok {
		t.Error("Lookup finds the address of a guest that left: its rules would follow it")
	}
	if err := ipam.Hold("default_unknown"); err != nil {
		t.Errorf("holding an id without an address: %v", err)
	}
	// An agent restart reads the hold back.
	if ipam, err = NewIPAM(network, pool, file); err != nil {
		t.Fatal(err)
	}
	if want := map[string]netip.Addr{"default_moved": moved.Addr()}; !reflect.DeepEqual(ipam.Held(), want) {
		t.Fatalf("held after a restart: %v, want %v", ipam.Held(), want)
	}
	newcomer, err := ipam.Allocate("team-b_new")
	if err != nil {
		t.Fatal(err)
	}
	if newcomer.Addr() == moved.Addr() {
		t.Fatalf("a new Machine got %s, held for the guest that left", newcomer.Addr())
	}

	// Still reported by its Machine: kept.
	stillHeld := map[string]netip.Addr{"default_moved": moved.Addr()}
	reports := func(id string, addr netip.Addr) bool { a, ok := stillHeld[id]; return ok && a == addr }
	if freed, err := ipam.ReleaseUnheld(reports); err != nil || len(freed) != 0 {
		t.Fatalf("released %v (%v) while the Machine reports the address", freed, err)
	}
	// Gone from the cluster: freed, and the lowest address is the pool's again.
	delete(stillHeld, "default_moved")
	if freed, err := ipam.ReleaseUnheld(reports); err != nil || !reflect.DeepEqual(freed, []string{"default_moved"}) {
		t.Fatalf("released %v (%v), want default_moved", freed, err)
	}
	if _, ok := ipam.Lookup("default_moved"); ok {
		t.Error("the released id still has its address")
	}
	next, err := ipam.Allocate("team-b_next")
	if err != nil || next.Addr() != moved.Addr() {
		t.Errorf("the next Machine got %v (%v), want the freed %s", next, err, moved.Addr())
	}

	// A guest that comes back before its hold is released keeps its
	// address, and it is no longer held.
	if err := ipam.Hold("team-b_new"); err != nil {
		t.Fatal(err)
	}
	back, err := ipam.Allocate("team-b_new")
	if err != nil || back != newcomer {
		t.Fatalf("the returning guest got %v (%v), want %s", back, err, newcomer)
	}
	if len(ipam.Held()) != 0 {
		t.Errorf("still held after the guest came back: %v", ipam.Held())
	}
	if freed, _ := ipam.ReleaseUnheld(func(string, netip.Addr) bool { return false }); len(freed) != 0 {
		t.Errorf("released %v: a running guest's address is not held", freed)
	}
}
