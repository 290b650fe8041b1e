package network

import (
	"errors"
	"net/netip"
	"path/filepath"
	"testing"
)

// A guest that migrated away keeps its address on its new node: the node
// it left must not hand the address out again while the guest has it.
func TestIPAMSkipsAddressesTakenElsewhere(t *testing.T) {
	ipam, err := NewIPAM(netip.MustParsePrefix("10.88.0.0/16"), netip.MustParsePrefix("10.88.2.0/24"), filepath.Join(t.TempDir(), "ipam.json"))
	if err != nil {
		t.Fatal(err)
	}
	elsewhere := map[netip.Addr]string{netip.MustParseAddr("10.88.2.1"): "team-a_moved"}
	ipam.Taken = func(id string, addr netip.Addr) bool { owner, ok := elsewhere[addr]; return ok && owner != id }
	notYet := errors.New("not looked yet")
	ready := notYet
	ipam.Ready = func() error { return ready }
	if _, err := ipam.Allocate("team-b_new"); !errors.Is(err, notYet) {
		t.Fatalf("an address assigned before Ready: %v", err)
	}
	ready = nil
	got, err := ipam.Allocate("team-b_new")
	if err != nil {
		t.Fatal(err)
	}
	if got.Addr() != netip.MustParseAddr("10.88.2.2") {
		t.Errorf("new Machine got %s, want 10.88.2.2 (10.88.2.1 is the moved guest's)", got)
	}
	// Once assigned, an address is returned whatever Ready says.
	ready = notYet
	if again, err := ipam.Allocate("team-b_new"); err != nil || again != got {
		t.Errorf("the assigned address again: %v, %v; want %s", again, err, got)
	}
	ready = nil
	// The guest itself, back on this node, keeps its address.
	back, err := ipam.AllocatePreferring("team-a_moved", netip.MustParseAddr("10.88.2.1"))
	if err != nil || back.Addr() != netip.MustParseAddr("10.88.2.1") {
		t.Errorf("the moved guest coming back got %v, %v; want 10.88.2.1", back, err)
	}
}
